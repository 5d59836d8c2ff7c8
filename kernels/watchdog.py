"""The launcher's no-progress watchdog: a run fails when no rank has finished an op for
`timeout` seconds, not when it has merely run long.

Progress is any change of a rank's (iteration, op index) pair in the shared `progress`
array (kernels.worker says what the pairs mean: a new index means the previous op
finished, or was posted for a comm op) and any message from a rank. `ProgressWatch` polls
the array, keeps when each rank last moved, and `stall_report` says, one line per
unfinished rank, what it last finished and what it is stuck on. Units: seconds
(time.monotonic).
"""
from __future__ import annotations

from typing import Any

from clustersim.schedules.names import PP

from .worker import BEFORE_PROGRAM, STARTUP, Job, describe_progress


class ProgressWatch:
    """When each of `world` ranks last moved in `progress`, and when any did."""

    def __init__(self, progress: Any, world: int, now: float):
        self.progress, self.world = progress, world
        self.seen = list(progress[:2 * world])
        self.moved = [now] * world
        self.last = now

    def poll(self, now: float) -> None:
        current = list(self.progress[:2 * self.world])
        for r in range(self.world):
            if current[2 * r: 2 * r + 2] != self.seen[2 * r: 2 * r + 2]:
                self.moved[r] = now
                self.last = now
        self.seen = current

    def touch(self, now: float) -> None:
        """A message from a rank arrived: progress too."""
        self.last = now

    def idle(self, now: float) -> float:
        """Seconds since any rank last made progress."""
        return now - self.last


def stall_report(job: Job, watch: ProgressWatch, finished: dict, now: float) -> str:
    """The KernelsError text of a stalled run: a first line with the rule and each
    unfinished rank's place, then one line per unfinished rank."""
    ranks = [r for r in range(job.world_size) if r not in finished]
    total = job.warmup_iterations + job.iterations
    where = "; ".join(f"rank {r} {_where(job, r, watch, total)}" for r in ranks)
    lines = [f"run timed out: no op finished on any rank for {job.timeout:g} s (the "
             f"no-progress timeout: a deadlocked schedule, or a stalled rank): {where}"]
    for r in ranks:
        lines.append(f"rank {r} (pipeline rank {_pipeline_rank(job, r)}) made no progress "
                     f"for {now - watch.moved[r]:.1f} s; {_last_and_next(job, r, watch, total)}")
    return "\n".join(lines)


def _pipeline_rank(job: Job, rank: int) -> int:
    return job.parallel.coords(rank)[PP]


def _where(job: Job, rank: int, watch: ProgressWatch, total: int) -> str:
    iteration, index = watch.seen[2 * rank: 2 * rank + 2]
    program = job.schedule.programs[_pipeline_rank(job, rank)]
    return describe_progress(program, total, iteration, index)


def _last_and_next(job: Job, rank: int, watch: ProgressWatch, total: int) -> str:
    """'last op done: 1F3, next: 1RECV_B2 (iteration 1 of 2)', or the rank's phase
    outside its program."""
    iteration, index = watch.seen[2 * rank: 2 * rank + 2]
    program = job.schedule.programs[_pipeline_rank(job, rank)]
    if iteration == STARTUP or iteration >= total or index == BEFORE_PROGRAM:
        return describe_progress(program, total, iteration, index)
    of = f"iteration {iteration + 1} of {total}"
    done = str(program[index - 1]) if index > 0 else f"none yet in {of}"
    if index >= len(program):
        return f"last op done: {done}, next: completing its posted comm ops ({of})"
    return f"last op done: {done}, next: {program[index]} ({of})"
