"""Clocks for one rank: when compute ran and when communication completed, in seconds.

All times are `time.perf_counter()` seconds, which on Linux is CLOCK_MONOTONIC: one clock
for every process of a host, so spans of different ranks on one host are directly
comparable (across hosts they would need a barrier-aligned offset).

- `HostClock` (CPU): a marker is the perf_counter value itself.
- `CudaClock`: a marker is a CUDA event recorded on the current stream; `seconds()`
  converts it after `synchronize()` as t_ref + elapsed(ref, event), where `ref` was
  recorded right after a device synchronize at host time t_ref. So GPU spans say when the
  kernels ran, not when the host enqueued them.
- `track_completion`: stamps the host time at which a torch.distributed work completes,
  through its future where the backend has one (NCCL: when the GPU finished it), else
  with a helper thread blocked in the work's wait (gloo: when the data has arrived).
"""
from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import torch


class HostClock:
    """Markers are perf_counter seconds (CPU: ops run synchronously on the host)."""

    def reset(self) -> float:
        return time.perf_counter()

    def mark(self) -> Any:
        return time.perf_counter()

    def synchronize(self) -> None:
        pass

    def seconds(self, marker: Any) -> float:
        return float(marker)


class CudaClock:
    """Markers are CUDA events; converted to perf_counter seconds after synchronize()."""

    def __init__(self, device: torch.device):
        self.device = device
        self._ref: torch.cuda.Event | None = None
        self._t_ref = 0.0

    def reset(self) -> float:
        torch.cuda.synchronize(self.device)
        self._t_ref = time.perf_counter()
        self._ref = torch.cuda.Event(enable_timing=True)
        self._ref.record()
        return self._t_ref

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def seconds(self, marker: Any) -> float:
        if isinstance(marker, float):
            return marker
        return self._t_ref + self._ref.elapsed_time(marker) / 1e3  # elapsed_time is in ms


def make_clock(device: torch.device) -> HostClock | CudaClock:
    return CudaClock(device) if device.type == "cuda" else HostClock()


class Completion:
    """When one posted work completed: `time` (perf_counter seconds) once known."""

    def __init__(self, work: Any):
        self.work = work
        self.time: float | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._threaded = False

    def _stamp(self, error: BaseException | None = None) -> None:
        self.time, self.error = time.perf_counter(), error
        self._done.set()

    def wait(self, timeout: float) -> None:
        """Block until the work completes; raise its error, or TimeoutError."""
        if not self._threaded:
            self.work.wait(timeout=datetime.timedelta(seconds=timeout))
            if self.time is None:
                self.time = time.perf_counter()
            return
        if not self._done.wait(timeout):
            raise TimeoutError(f"not completed after {timeout:g} s")
        if self.error is not None:
            raise self.error


def track_completion(work: Any) -> Completion:
    """Stamp `work`'s completion time: through its future where the backend has one
    (NCCL), else by a helper thread blocked in `work.wait()` — the only waiter, since a
    gloo send/recv work can be waited on once and reports no completion before that."""
    done = Completion(work)
    try:
        future = work.get_future()
    except RuntimeError:  # gloo send/recv: "Work::getFuture not implemented"
        future = None
    if future is not None:
        future.add_done_callback(lambda _: done._stamp())
        return done
    done._threaded = True

    def wait() -> None:
        try:
            work.wait()  # releases the GIL while blocked
        except BaseException as exc:  # noqa: BLE001 (handed to the waiting main thread)
            done._stamp(exc)
        else:
            done._stamp()

    threading.Thread(target=wait, daemon=True, name="kernels-comm-wait").start()
    return done
