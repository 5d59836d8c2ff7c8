"""Naive model parallelism: the model's layers split over the ranks and one microbatch
at a time through them, forward down the pipeline and backward up it, before the next
microbatch starts (the picture that motivates pipelining: Huang et al. 2019, GPipe,
figure 2b). Every rank's program is F(0) B(0) F(1) B(1) ...; with uniform stage costs
F and B the iteration takes M * P * (F + B), each rank is busy 1/P of it (bubble
(P-1)/P), and it holds one microbatch's activations."""
from __future__ import annotations

from ..ops import Op, OpKind
from ..schedule_entry import ScheduleEntry


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    return [[Op(kind, stage, m) for m in range(microbatches) for kind in (OpKind.F, OpKind.B)]
            for (stage,) in rank_stages]


SCHEDULES = [ScheduleEntry(
    "naive", programs, source="Huang et al., NeurIPS 2019, figure 2b",
    summary="one microbatch at a time through all stages (no pipelining)",
    aliases=("naive-model-parallel", "naive-model-parallelism"))]
