"""Progress of a long simulation, shown only where someone watches: inside `reporting()`
(the CLI enters it), a replay that runs longer than SHOW_AFTER seconds shows a tqdm bar of
ops done on a terminal, or one status line on stderr every STATUS_EVERY seconds when stderr
is not a terminal (a log). Library calls report nothing. The engine calls `tick` every
CHECK_EVERY events (sim.engine), so the cost is one counter per event. `note` says a fact
of the run (where it runs: sim.backends) on stderr inside `reporting()`, in the log
otherwise; `quiet()` turns reporting off (a sweep's runs: its own bar shows them).
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

SHOW_AFTER = 2.0  # s of wall time before anything is shown
STATUS_EVERY = 30.0  # s between status lines on a non-terminal stderr
CHECK_EVERY = 1 << 14  # events between two looks at the clock

_active: ContextVar[bool] = ContextVar("clustersim_progress", default=False)
log = logging.getLogger(__name__)


@contextmanager
def _reporting(on: bool) -> Iterator[None]:
    token = _active.set(on)
    try:
        yield
    finally:
        _active.reset(token)


def reporting() -> AbstractContextManager[None]:
    """Within it, simulations report their progress (module docstring)."""
    return _reporting(True)


def quiet() -> AbstractContextManager[None]:
    """Within it, nothing reports its progress, even inside `reporting()`."""
    return _reporting(False)


def note(text: str) -> None:
    """One line about the run: on stderr where someone watches, else logged (INFO)."""
    if _active.get():
        print(f"clustersim: {text}", file=sys.stderr, flush=True)
    else:
        log.info(text)


class Progress:
    """One replay's progress: `tick(done)` with the ops done so far, of `total`."""

    def __init__(self, total: int, what: str = "simulating") -> None:
        self.total, self.what = total, what
        self.on = _active.get()
        self.started = time.perf_counter()
        self.last_status = self.started
        self.bar: Any = None

    def tick(self, done: int) -> None:
        if not self.on:
            return
        now = time.perf_counter()
        if now - self.started < SHOW_AFTER:
            return
        if sys.stderr.isatty():
            if self.bar is None:
                from tqdm import tqdm
                self.bar = tqdm(total=self.total, desc=self.what, unit="op", leave=False,
                                file=sys.stderr)
            self.bar.update(done - self.bar.n)
        elif now - self.last_status >= STATUS_EVERY:
            self.last_status = now
            print(f"clustersim: {self.what}: {done:,} of {self.total:,} ops "
                  f"({done / max(self.total, 1):.0%}), {now - self.started:.0f} s",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
