"""Lowering pass: insert the SEND/RECV ops that carry activations and gradients.

For each compute op whose neighbouring stage lives on another rank:
`RECV_F(s,m)` goes immediately before `F(s,m)` and `SEND_F(s,m)` immediately after it;
`RECV_B(s,m)` before `B/I(s,m)` and `SEND_B(s,m)` after it. This is Megatron-LM's default
(non-overlapped) P2P placement: a rank posts the receive for its next op only when it
reaches that op, so a late transfer shows up as exposed communication.
"""
from __future__ import annotations

from collections.abc import Callable

from .ops import Op, OpKind, p2p_op
from .schedule import Schedule

BoundaryBytes = Callable[[int], int]
"""Bytes of the activation (or its gradient) crossing the boundary after stage s."""


def boundary(kind: OpKind, stage: int) -> int:
    """The stage boundary a P2P op crosses, named by the stage before it: SEND_F(s,m) and
    RECV_B(s,m) cross boundary s; RECV_F(s,m) and SEND_B(s,m) cross boundary s-1."""
    return stage - 1 if kind in (OpKind.RECV_F, OpKind.SEND_B) else stage


def add_p2p(schedule: Schedule, boundary_bytes: BoundaryBytes | None = None) -> Schedule:
    """Return `schedule` with SEND/RECV ops inserted; idempotent on lowered schedules."""
    if schedule.has_p2p:
        return schedule
    nbytes = boundary_bytes or (lambda stage: 0)
    ranks = schedule.stage_ranks
    last = schedule.num_stages - 1

    def remote(a: int, b: int) -> bool:
        return ranks[a] != ranks[b]

    def comm(kind: OpKind, stage: int, microbatch: int | None) -> Op:
        return p2p_op(kind, stage, microbatch, nbytes(boundary(kind, stage)))

    programs = []
    for program in schedule.programs:
        lowered: list[Op] = []
        for op in program:
            s, m = op.stage, op.microbatch
            if op.kind is OpKind.F:
                if s > 0 and remote(s - 1, s):
                    lowered.append(comm(OpKind.RECV_F, s, m))
                lowered.append(op)
                if s < last and remote(s, s + 1):
                    lowered.append(comm(OpKind.SEND_F, s, m))
            elif op.kind in (OpKind.B, OpKind.I):
                if s < last and remote(s, s + 1):
                    lowered.append(comm(OpKind.RECV_B, s, m))
                lowered.append(op)
                if s > 0 and remote(s - 1, s):
                    lowered.append(comm(OpKind.SEND_B, s, m))
            else:
                lowered.append(op)
        programs.append(lowered)
    return schedule.with_programs(programs)
