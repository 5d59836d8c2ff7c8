"""Run the clustersim CLI from a benchmark as a user would (`python -m clustersim ...` on this
checkout), spell the command for the results page, and keep the raw results beside it."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from clustersim.sim.cli import EXIT_USAGE

ROOT = Path(__file__).resolve().parent.parent


class Refused(SystemExit):
    """clustersim rejected the input with its clear error (exit status EXIT_USAGE, last
    line 'clustersim: error: ...'), as opposed to crashing."""


def clustersim(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run `clustersim ARGS` in `cwd`; a failure ends the benchmark with its stderr
    (`Refused` when clustersim rejected the input, which a benchmark may record)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-m", "clustersim", *args], cwd=cwd, text=True,
                            capture_output=True, env={**os.environ, "PYTHONPATH": path})
    if result.returncode:
        message = f"clustersim {' '.join(args)} failed:\n{result.stderr}"
        lines = result.stderr.strip().splitlines()
        if result.returncode == EXIT_USAGE and lines and lines[-1].startswith("clustersim: error:"):
            raise Refused(message)
        raise SystemExit(message)
    return result


def command(*args: str) -> str:
    return "clustersim " + " ".join(shlex.quote(a) for a in args)


def measured_or_saved(raw: Path, render: bool, measure: Callable[[Path], dict],
                      environment: Callable[[], dict]) -> dict:
    """With `render`, the raw results saved in `raw`; else `measure(workdir)` in a temporary
    folder, stamped with `environment()` and saved to `raw` (JSON)."""
    if render:
        return json.loads(raw.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        data = measure(Path(tmp))
    data["environment"] = environment()
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(data, indent=1) + "\n")
    return data
