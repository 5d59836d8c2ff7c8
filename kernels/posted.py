"""Posted communication ops of one rank (a mixin of kernels.executor.RankExecutor): each
posted op's completion (kernels.timing), its span (lane, bytes; end = completion time),
and the step that applies its result, run once, when an op waits for it or at the end
of the iteration. Units: seconds (clock markers), bytes.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clustersim.schedules.ops import Op

from .errors import KernelsError
from .timing import Completion, track_completion


@dataclass
class Pending:
    """A posted comm op: its completion, what it keeps alive, its span, its result step."""

    done: Completion
    keep: Any
    span: dict
    finish: Callable[[], None] | None
    applied: bool = False


class PostedOps:
    """Mixin: record, await and drain posted comm ops; record spans."""

    def _post(self, op: Op, lane: str, work: Any, keep: Any, nbytes: int, start: Any,
              info: dict, finish: Callable[[], None] | None = None) -> Completion:
        """Record a posted comm op of the current index (`keep`: tensors to keep alive
        until it completes; `finish`: applies its result, once, when it is awaited)."""
        span = self._span(op, lane, start, None, nbytes, info)
        done = track_completion(work)
        self._pending[self.index] = Pending(done, keep, span, finish)
        return done

    def _complete(self, index: int) -> None:
        """Wait for comm op `index` (if it is one) and apply its result once."""
        pending = self._pending.get(index)
        if pending is None or pending.applied:
            return
        self._wait(pending.done, f"waiting for {pending.span['op']}")
        pending.applied = True
        if pending.finish is not None:
            pending.finish()

    def _span(self, op: Op, lane: str, start: Any, end: Any, nbytes: int,
              info: dict | None) -> dict:
        span = {"rank": self.setup.rank, "lane": lane, "op": str(op), "start": start,
                "end": end, "nbytes": int(nbytes), "flops": float(op.flops)}
        if op.group is not None:
            span["group"] = op.group
        if info:
            span["info"] = info
        self.spans.append(span)
        return span

    def _wait(self, done: Completion, what: str) -> None:
        try:
            done.wait(self.setup.timeout)
        except Exception as exc:  # noqa: BLE001 (re-raised with the op named)
            raise KernelsError(f"{what}: {type(exc).__name__}: {exc}") from exc

    def _drain(self) -> None:
        """Wait for every posted comm op, apply collective results, then resolve markers."""
        for index in sorted(self._pending):
            self._complete(index)
        self.clock.synchronize()
        for pending in self._pending.values():
            done = pending.done
            pending.span["end"] = done.time if done.time is not None else time.perf_counter()
        self._pending = {}
