"""Output files: never one of the run's inputs, never half-written (issue 15).

- `check_outputs` runs before any work (a simulation, a calibration that measures for
  minutes): an output path that is empty, names a directory, cannot be written (its
  directory is missing and cannot be created, or is not writable: a probe file is created
  and removed; an existing file is opened for appending, which changes nothing), is one
  of the run's input files (the same file, through any spelling or link), or is given to
  two outputs is refused, naming the flag and the rule.
- `write_text_atomic` writes a temporary file beside the target and renames it over the
  target: a reader never sees a partial file, an interrupted run leaves the old file, and
  a symbolic link at the target is replaced, not followed (the file it points to is left
  alone). A device or FIFO at the target (`-o /dev/null`) is written into, never replaced.
- `write_output` writes one output and returns the CLI's line for it, which says when it
  replaced a file that was there.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from .errors import ConfigError


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_outputs(outputs: Mapping[str, str | None],
                  inputs: Mapping[str, str | None] | None = None) -> None:
    """ConfigError naming the flags when an output (flag -> path; None = not written)
    cannot be written, is an input (flag -> path of a file the run reads), or is another
    output's path (module docstring)."""
    for flag, path in outputs.items():
        if path is not None and not str(path):
            raise ConfigError(f"{flag}: an empty path")
    given = {flag: Path(path) for flag, path in outputs.items() if path is not None}
    read = {flag: Path(path) for flag, path in (inputs or {}).items() if path}
    for flag, path in given.items():
        problem = _unwritable(path)
        if problem:
            raise ConfigError(f"{flag} {path}: {problem}")
        for source, input_path in read.items():
            if _same(path, input_path) or path.resolve() == input_path.resolve():
                raise ConfigError(f"{flag} {path} is the run's input {source}: an output "
                                  f"never overwrites an input; choose another path")
    seen: dict[Path, str] = {}
    for flag, path in given.items():
        key = path.resolve()
        if key in seen:
            raise ConfigError(f"{flag} and {seen[key]} both write {path}: give each output "
                              f"its own path")
        seen[key] = flag


def _unwritable(path: Path) -> str | None:
    """Why `path` cannot be written by write_text_atomic (which creates missing
    directories), or None if it can."""
    if path.is_dir():
        return "is a directory, give a file path"
    directory = path.absolute().parent
    if not directory.is_dir():
        return _cannot_create(directory)
    if path.exists():
        if not path.is_file():  # a device or FIFO: opening could block
            return None if os.access(path, os.W_OK) else "cannot be written"
        try:
            with open(path, "ab"):
                return None
        except OSError as err:
            return f"cannot be written ({err.strerror or err})"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # a dangling link, or created meanwhile: the write will tell
        return None
    except OSError as err:
        return f"cannot be created ({err.strerror or err})"
    os.close(fd)
    os.unlink(path)
    return None


def _cannot_create(directory: Path) -> str | None:
    """Why the missing `directory` cannot be created, or None when it can (a probe
    directory is made in its nearest existing ancestor and removed)."""
    ancestor = directory
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".clustersim-probe-", dir=ancestor))
    except OSError as err:
        return f"directory {directory} cannot be created ({err.strerror or err})"
    return None


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file and a rename (module docstring)."""
    path = Path(path)
    if _special(path):
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    return path


def _special(path: Path) -> bool:
    """A device or FIFO (not a file, directory or link) is at `path`."""
    return path.exists() and not path.is_symlink() and not path.is_file() \
        and not path.is_dir()


def write_output(path: str | Path, write: Callable[[Path], object]) -> str:
    """Call `write(path)` (an atomic writer) and return the CLI's line for it."""
    path = Path(path)
    replaced = os.path.lexists(path) and not _special(path)
    write(path)
    return f"wrote {path}" + (" (replaced the file that was there)" if replaced else "")
