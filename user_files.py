"""Read the files a user hands in (torch CSV schedules, calibration profiles, Timeline
JSON, topology JSON) so that bad input ends in one error line, never a traceback, a hang
or runaway memory. Standard library only: the one module of the package root that both
`schedules` and `topologies` may import (docs/architecture.md, "Layers").

`read_text` checks the path before opening it (missing, a directory, a device or pipe:
refused without blocking), reads at most `max_bytes` + 1 bytes (default MAX_FILE_BYTES,
256 MiB) and decodes strict UTF-8 (a leading byte-order mark is dropped; a NUL character
marks a binary file). `parse_json` parses standard JSON text nested at most
MAX_JSON_DEPTH (64) arrays/objects deep; clustersim's own files nest at most 6 deep.
Every error is raised as the caller's error class, one line:
`<source>: <problem>; rule: <rule>` (or `cannot read <source>: <reason>`).
"""
from __future__ import annotations

import codecs
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 256 * 1024 * 1024  # bytes read at most before parsing
MAX_JSON_DEPTH = 64  # nested JSON arrays/objects; the top-level value is depth 1
_MIB = 1024 * 1024


def read_text(path: str | Path, source: str, error: type[Exception],
              max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of regular file `path`, at most `max_bytes` bytes long.

    `source` names the file in messages (e.g. "profile run/p.json"); `error` is the
    exception class raised, with one line naming the file and the rule broken.
    """
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:  # ValueError: a NUL character in the path
        raise error(f"cannot read {source}: {_reason(exc)}") from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{source}: is a directory; rule: give the path of a file")
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{source}: not a regular file (a device, pipe or socket); rule: "
                    "give the path of a file")
    too_big = (f"{source}: larger than {max_bytes / _MIB:g} MiB; rule: clustersim reads "
               f"files of at most {max_bytes / _MIB:g} MiB (its own files of this kind "
               "are far smaller), so this is not one")
    if info.st_size > max_bytes:
        raise error(too_big)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"cannot read {source}: {_reason(exc)}") from None
    if len(data) > max_bytes:  # grew since stat, or a special file reporting size 0
        raise error(too_big)
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                    f"{exc.start}); rule: the file must be UTF-8 text") from None
    nul = text.find("\0")
    if nul >= 0:
        raise error(f"{source}: NUL character at offset {nul}, a binary file; rule: the "
                    "file must be UTF-8 text")
    return text


def parse_json(text: str, source: str, error: type[Exception],
               max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value of `text`, nested at most `max_depth` arrays/objects deep.

    Raises `error` naming `source` for empty text, a syntax error (line and column), a
    number too long to read and too deep nesting. Non-standard NaN/Infinity are accepted
    here; the loaders check their numbers (`is_finite_number`).
    """
    if not text.strip():
        raise error(f"{source}: empty file; rule: the file must hold one JSON value")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{source}: not valid JSON (invalid JSON at line {exc.lineno} column "
                    f"{exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise error(_too_deep(source, max_depth)) from None
    except ValueError as exc:  # an integer literal over Python's 4300-digit limit
        reason = str(exc).split(":")[0]
        raise error(f"{source}: not valid JSON ({reason}); rule: numbers of at most "
                    "4300 digits") from None
    if _depth_exceeds(value, max_depth):
        raise error(_too_deep(source, max_depth))
    return value


def is_finite_number(value: object) -> bool:
    """True for an int or float (not a bool) that is finite as a float (huge ints are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def short_repr(value: object, limit: int = 60) -> str:
    """`repr(value)` cut to about `limit` characters, for one-line messages."""
    if isinstance(value, (str, bytes)):
        value = value[:limit]
    if isinstance(value, (list, dict)) and len(value) > limit // 4:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _too_deep(source: str, max_depth: int) -> str:
    return (f"{source}: JSON nested deeper than {max_depth} levels; rule: at most "
            f"{max_depth} nested arrays/objects")


def _depth_exceeds(value: Any, max_depth: int) -> bool:
    """Whether `value` nests more than `max_depth` lists/dicts (iterative: no recursion)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > max_depth:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _reason(exc: Exception) -> str:
    return (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) \
        or type(exc).__name__
