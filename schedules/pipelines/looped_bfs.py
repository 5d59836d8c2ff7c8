"""Looped BFS, breadth-first pipeline parallelism (Lamy-Poirier, "Breadth-First Pipeline
Parallelism", MLSys 2023, arXiv 2211.05953; torch.distributed.pipelining's
ScheduleLoopedBFS): rank r holds V stages in the loop placement (r, r+P, ...) and runs,
stage by stage in order, the forwards of all microbatches, then, stage by stage in reverse,
the backwards of all microbatches in reverse microbatch order. Every rank holds all V*M
microbatch-stages' activations at its peak, as GPipe does per stage."""
from __future__ import annotations

from ..ops import Op, OpKind
from ..schedule_entry import ScheduleEntry


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    out = []
    for stages in rank_stages:
        out.append([Op(OpKind.F, s, m) for s in stages for m in range(microbatches)]
                   + [Op(OpKind.B, s, m) for s in reversed(stages)
                      for m in reversed(range(microbatches))])
    return out


SCHEDULES = [ScheduleEntry(
    "looped-bfs", programs, source="Lamy-Poirier, MLSys 2023 (arXiv 2211.05953)",
    summary="breadth-first: all microbatches through a rank's first stage, then its next",
    aliases=("ScheduleLoopedBFS", "bfs", "breadth-first"), default_vpp=2, max_vpp=None)]
