"""Machine, versions and date stamped on every benchmark result."""
from __future__ import annotations

import contextlib
import datetime
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def uncommitted(tree: Path) -> str:
    """' + uncommitted changes' when `tree`'s tracked files differ from its commit
    (benchmarks/results aside: a benchmark rewrites its own results), else ''."""
    changed = subprocess.run(["git", "-C", str(tree), "status", "--porcelain",
                              "--untracked-files=no", "--", ".", ":!benchmarks/results"],
                             capture_output=True, text=True, check=True).stdout.strip()
    return " + uncommitted changes" if changed else ""


def tree_version(tree: Path) -> str:
    """`tree`'s short commit, and whether its code has uncommitted changes."""
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    return commit + uncommitted(tree)


@contextlib.contextmanager
def importable(tree: Path) -> Iterator[Path]:
    """A temporary folder for PYTHONPATH whose `clustersim` is `tree` (a repository root:
    the root is the package), so a process imports that tree's code; removed on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "clustersim").symlink_to(Path(tree).resolve(), target_is_directory=True)
        yield Path(tmp)


@contextlib.contextmanager
def checked_out(tree: Path, commit: str) -> Iterator[tuple[str, Path, Path]]:
    """`commit` of the repository at `tree` as a detached git worktree in a temporary
    folder: (its full hash, the worktree, a folder for PYTHONPATH whose `clustersim` is
    the worktree: `importable`); removed on exit."""
    sha = subprocess.run(["git", "-C", str(tree), "rev-parse", commit], check=True,
                         capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(tree), "worktree", "add", "--detach", str(work), sha],
                       check=True, capture_output=True)
        try:
            with importable(work) as package:
                yield sha, work, package
        finally:
            subprocess.run(["git", "-C", str(tree), "worktree", "remove", "--force", str(work)],
                           check=True, capture_output=True)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment() -> dict[str, str]:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores, {platform.machine()}",
        "os": platform.platform(),
        "python": platform.python_version(),
        **{pkg: _version(pkg) for pkg in ("clustersim", "simpy", "networkx", "numpy", "plotly")},
    }


def environment_markdown() -> str:
    return "\n".join(f"- {k}: {v}" for k, v in environment().items())
