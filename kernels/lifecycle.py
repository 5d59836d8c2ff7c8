"""Rank processes live no longer than the process that started them (issue 15).

Parent side:
- `parent_link(ctx)`: a pipe whose only write end the launching process holds; every
  rank gets the read end. When the launcher exits or is killed (even by SIGKILL), the
  kernel closes the write end and each rank reads end-of-file.
- `exit_on_signals()`: while ranks run, SIGTERM and SIGHUP (when their action is the
  default, which ends the process without running any cleanup) raise
  SystemExit(128 + signal) instead, so the launcher's `finally` kills its ranks first.
- `stop(procs)`: kill every started rank process that is alive and reap it.

- `rank_session(ctx, wait_s)`: all of the above for one launch (kernels.launch and
  kernels.calibrate): the loopback store (kernels.rendezvous), a results queue, the
  link, and the processes the caller starts through it, torn down on the way out.

Rank side, `die_with_parent(link)` first thing in a rank process:
- a daemon thread blocks on the link and ends the process (exit code EXIT_ORPHANED) at
  its end-of-file: the launcher is gone;
- on Linux also prctl(PR_SET_PDEATHSIG, SIGKILL) (man 2 prctl): the kernel kills the
  rank when its parent dies, even if the rank is wedged holding the GIL. A forkserver
  rank's parent is the forkserver, which exits once no process holds its "alive" pipe;
  each rank closes its inherited copy of that pipe, so the launcher's death ends the
  forkserver and, through the signal, its ranks; the multiprocessing resource tracker
  exits when they all have (its pipe closes).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .rendezvous import serve_store

EXIT_ORPHANED = 75  # a rank whose launcher went away
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_REAP_S = 5.0


def parent_link(ctx: Any) -> tuple[Any, Any]:
    """(read end for the ranks, write end the caller keeps open while they run)."""
    return ctx.Pipe(duplex=False)


def die_with_parent(link: Any) -> None:
    """In a rank process: end this process when the launcher holding `link`'s write
    end is gone (see the module docstring)."""
    _close_forkserver_alive_fd()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch, args=(link,), name="clustersim-parent-watch",
                     daemon=True).start()


def _watch(link: Any) -> None:
    try:
        while True:
            link.recv_bytes()  # the launcher never sends: this returns only at EOF
    except (EOFError, OSError):
        pass
    os._exit(EXIT_ORPHANED)


def _close_forkserver_alive_fd() -> None:
    """A forkserver child inherits the pipe whose end-of-file tells the forkserver that
    its launcher exited; close that copy so only the launcher keeps it open."""
    from multiprocessing import forkserver
    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


@contextlib.contextmanager
def exit_on_signals() -> Iterator[None]:
    """SIGTERM/SIGHUP raise SystemExit(128 + signal) inside this block, once (a second
    signal during the cleanup is ignored). Only where the signal's action is the default,
    and only in the main thread (elsewhere Python cannot install handlers): a caller's
    own handler is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = []

    def handler(signum: int, frame: Any) -> None:
        if not fired:
            fired.append(signum)
            raise SystemExit(128 + signum)

    previous = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stop(procs: list) -> None:
    """Kill the started processes of `procs` that are still alive, then reap them."""
    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.kill()
    for p in started:
        p.join(timeout=_REAP_S)


@dataclass
class RankSession:
    """One launch's shared parts: the store's port, the queue the ranks report on, the
    read end of the parent link (pass it to each rank), and the started processes."""
    port: int
    results: Any
    link: Any
    procs: list = field(default_factory=list)

    def start(self, procs: list) -> None:
        """Start `procs` (multiprocessing processes), each kept for the teardown."""
        for p in procs:
            self.procs.append(p)
            p.start()


@contextlib.contextmanager
def rank_session(ctx: Any, wait_s: float) -> Iterator[RankSession]:
    """Serve a loopback store whose waits last `wait_s` seconds, make the results queue
    and the parent link; on the way out (normal, error or SIGTERM/SIGHUP) kill and reap
    every started rank, then close the link, the queue and the store."""
    with exit_on_signals():
        store = serve_store(wait_s)
        results = ctx.Queue()
        link, keep = parent_link(ctx)
        session = RankSession(store.port, results, link)
        try:
            yield session
        finally:
            stop(session.procs)
            keep.close()
            link.close()
            results.close()
            del store
