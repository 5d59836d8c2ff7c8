"""Lowering pass: data-parallel gradient synchronisation as ALL_REDUCE ops.

Each rank's program gets one `ALL_REDUCE(stage, group='dp')` per stage it holds, after the
stage's last backward op, in the order those backwards end: the gradients are reduced
once per iteration, after gradient accumulation over all microbatches (PyTorch DDP's
`no_sync` / Megatron's accumulation). Buckets, overlap with the remaining backward and
ZeRO's reduce-scatter come with the data-parallel issue; this is the plain DDP baseline.
`nbytes` (the stage's gradient bytes) is filled in by schedules.annotate.
"""
from __future__ import annotations

from .ops import BACKWARD_KINDS, Op, OpKind
from .schedule import Schedule


def add_dp_allreduce(schedule: Schedule) -> Schedule:
    """Return `schedule` with a DP gradient all-reduce per stage; idempotent."""
    if any(op.kind is OpKind.ALL_REDUCE for op in schedule.ops()):
        return schedule
    programs = []
    for program in schedule.programs:
        last_backward: dict[int, int] = {}
        for index, op in enumerate(program):
            if op.kind in BACKWARD_KINDS:
                last_backward[op.stage] = index
        stages = sorted(last_backward, key=last_backward.__getitem__)
        programs.append(list(program) + [Op(OpKind.ALL_REDUCE, s, None, group="dp")
                                          for s in stages])
    return schedule.with_programs(programs)
