"""GPipe (Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
Parallelism", NeurIPS 2019): every rank runs the forwards of all microbatches, then all
their backwards in microbatch order. Unit-time makespan 2(M + P - 1); every rank holds all
M microbatches' activations at its peak."""
from __future__ import annotations

from ..ops import Op, OpKind
from ..schedule_entry import ScheduleEntry


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    return [[Op(OpKind.F, stage, m) for m in range(microbatches)]
            + [Op(OpKind.B, stage, m) for m in range(microbatches)]
            for (stage,) in rank_stages]


SCHEDULES = [ScheduleEntry(
    "gpipe", programs, source="Huang et al., NeurIPS 2019",
    summary="all forwards, then all backwards", aliases=("ScheduleGPipe",))]
