"""Headless Chromium for tests: render an HTML file to its live DOM or to a PNG.

Tests that use it are marked `browser`. Without Chromium they skip locally and fail
when the `CI` environment variable is set (CI installs Chromium).
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def require_chromium() -> str:
    path = find_chromium()
    if path is None:
        message = "headless Chromium not found (install the `chromium` package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def _run(args: list[str], profile: Path, budget_ms: int) -> subprocess.CompletedProcess:
    cmd = [require_chromium(), *FLAGS, f"--user-data-dir={profile}",
           f"--virtual-time-budget={budget_ms}", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    if result.returncode != 0:
        raise RuntimeError(f"chromium exited {result.returncode}: {result.stderr[-2000:]}")
    return result


def dump_dom(html: Path, workdir: Path, budget_ms: int = 15000) -> str:
    """The DOM after the page's scripts ran (plotly draws synchronously on load)."""
    return _run(["--dump-dom", html.resolve().as_uri()], workdir / "profile-dom",
                budget_ms).stdout


def screenshot(html: Path, png: Path, workdir: Path, size: tuple[int, int] = (1600, 900),
               budget_ms: int = 15000) -> bytes:
    _run([f"--screenshot={png}", f"--window-size={size[0]},{size[1]}",
          html.resolve().as_uri()], workdir / "profile-png", budget_ms)
    return png.read_bytes()


def png_summary(data: bytes) -> tuple[int, int, int, float]:
    """(width, height, distinct byte values, non-zero fraction) of the filtered pixel
    stream: a blank page filters to almost all zeros, a chart does not."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    nonzero = len(raw) - raw.count(0)
    return width, height, len(set(raw)), nonzero / len(raw)
