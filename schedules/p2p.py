"""Lowering pass: insert the SEND/RECV ops that carry activations and gradients.

For each compute op whose neighbouring stage lives on another rank:
`RECV_F(s,m)` goes immediately before `F(s,m)` and `SEND_F(s,m)` immediately after it;
`RECV_B(s,m)` before `B/I(s,m)` and `SEND_B(s,m)` after it. This is Megatron-LM's default
(non-overlapped) P2P placement: a rank posts the receive for its next op only when it
reaches that op, so a late transfer shows up as exposed communication. When an op is
split into layer groups (`Op.chunk`), the RECV goes before the first group of (s,m) and
the SEND after the last, whatever else the program interleaves between them. An
overlapped pair (DualPipe's F&B: an F and a B, both marked `overlapped`) receives both its
inputs before the F and sends both outputs after the B.
"""
from __future__ import annotations

from collections.abc import Callable

from .ops import INPUT_GRAD_KINDS, Op, OpKind, overlapped_pairs, p2p_op
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
    ends = _transfer_ends(schedule, boundary_bytes or (lambda stage: 0))
    programs = []
    for program in schedule.programs:
        first, final = _group_ends(program)
        lowered: list[Op] = []
        append = lowered.append
        for index, op in enumerate(program):
            kind = op.kind
            if kind is OpKind.F or kind in INPUT_GRAD_KINDS:
                recv, send = ends(kind is OpKind.F, op.stage)
                if recv is not None and (first is None or index in first):
                    append(p2p_op(recv[0], op.stage, op.microbatch, recv[1]))
                append(op)
                if send is not None and (final is None or index in final):
                    append(p2p_op(send[0], op.stage, op.microbatch, send[1]))
            else:
                append(op)
        programs.append(_pair_transfers(lowered))
    return schedule.with_programs(programs)


End = tuple[OpKind, int] | None  # a transfer's kind and bytes; None: no transfer there


def _transfer_ends(schedule: Schedule, nbytes: BoundaryBytes
                   ) -> Callable[[bool, int], tuple[End, End]]:
    """(forward?, stage) -> the RECV before and the SEND after a compute op of that
    direction on that stage (module docstring), found once per stage and direction: an F
    talks to the stage before it in its chain (schedules.chains) and the one after; a
    backward the other way round."""
    ranks, chains = schedule.stage_ranks, schedule.stage_chains
    found: dict[tuple[bool, int], tuple[End, End]] = {}

    def end(kind: OpKind, stage: int, other: int | None) -> End:
        if other is None or ranks[other] == ranks[stage]:
            return None
        return kind, nbytes(boundary(kind, stage))

    def ends(forward: bool, stage: int) -> tuple[End, End]:
        both = found.get((forward, stage))
        if both is None:
            before, after = ((chains.previous(stage), chains.next(stage)) if forward
                             else (chains.next(stage), chains.previous(stage)))
            recv, send = ((OpKind.RECV_F, OpKind.SEND_F) if forward
                          else (OpKind.RECV_B, OpKind.SEND_B))
            both = found[(forward, stage)] = (end(recv, stage, before),
                                              end(send, stage, after))
        return both
    return ends


def _pair_transfers(program: list[Op]) -> list[Op]:
    """An overlapped pair (an F and a B, both `overlapped`) receives both inputs before
    it and sends both outputs after it (torch's lowering of OVERLAP_F_B, DeepSeek's
    `_forward_backward_chunk`): the B's RECV moves before the F, the F's SEND after the B
    (schedules.contract.pair_waits); other ops between them stay between them."""
    pairs = dict(overlapped_pairs(program)) if any(op.overlapped for op in program) else {}
    if not pairs:
        return program
    out: list[Op] = []
    i = 0
    while i < len(program):
        if i not in pairs:
            out.append(program[i])
            i += 1
            continue
        j = pairs[i]
        between = program[i + 1:j]
        out += [o for o in between if o.kind is OpKind.RECV_B] + [program[i]]
        out += [o for o in between if not o.kind.is_p2p] + [program[j]]
        out += [o for o in between if o.kind.is_p2p and o.kind is not OpKind.RECV_B]
        i = j + 1
    return out


def _group_ends(program: list[Op]) -> tuple:
    """Indices of the first and last F, and of the first and last B/I, of each (s,m):
    where its RECV and SEND go (None, None: every op's own, when nothing is chunked)."""
    if all(op.chunk is None for op in program):
        return None, None
    first: dict[tuple, int] = {}
    final: dict[tuple, int] = {}
    for index, op in enumerate(program):
        if op.kind in (OpKind.F, OpKind.B, OpKind.I):
            key = (op.kind is OpKind.F, op.stage, op.microbatch)
            first.setdefault(key, index)
            final[key] = index
    return set(first.values()), set(final.values())
