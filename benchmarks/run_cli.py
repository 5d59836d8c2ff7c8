"""Run the clustersim CLI from a benchmark as a user would (`python -m sim ...` on this
checkout), and spell the command for the results page."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def clustersim(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run `clustersim ARGS` in `cwd`; a failure ends the benchmark with its stderr."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-m", "sim", *args], cwd=cwd, text=True,
                            capture_output=True, env={**os.environ, "PYTHONPATH": path})
    if result.returncode:
        raise SystemExit(f"clustersim {' '.join(args)} failed:\n{result.stderr}")
    return result


def command(*args: str) -> str:
    return "clustersim " + " ".join(shlex.quote(a) for a in args)
