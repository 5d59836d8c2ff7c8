"""ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241,
section 6; Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024, arXiv
2405.15362, its V-ZB; torch.distributed.pipelining's ScheduleZBVZeroBubble, whose
per-rank F/I/W order this reproduces).

The model is cut into 2P chunks placed in a V: rank r holds chunk 0 = stage r and chunk 1
= stage 2P-1-r, so rank 0 holds the first and the last stage. Each rank runs its chunks'
microbatches in order (F, I and W of a chunk each in microbatch order) as follows, for
N = max(M, 2P-1) microbatches (torch pads short runs so that the pipeline fills), ops
of microbatches >= M then dropped:
- warm-up: 2(P-r)-1 forwards of chunk 0; r pairs (F chunk 1, F chunk 0); P-r triples
  (F, I, W) of chunk 1;
- steady state, N-P rounds: F of chunk 0 (while any remain; the first N-2P+r+1 rounds),
  I and W of chunk 0, F, I and W of chunk 1;
- cool-down: r pairs (I chunk 0, I chunk 1); P-r pairs (I, W) of chunk 0; the r
  outstanding W of chunk 1, then the r of chunk 0.
A rank holds (F until W) at most 2P microbatch-chunks, half a 1F1B stage each: P stages'
worth, 1F1B's first-rank peak, now on every rank (the papers' ZB-V memory). Torch accepts
any M >= 1 and exactly 2 chunks per rank (vpp = 2).
"""
from __future__ import annotations

from ..ops import Op, OpKind
from ..placement import V_SHAPE
from ..schedule_entry import ScheduleEntry

F, I, W = OpKind.F, OpKind.I, OpKind.W  # noqa: E741


def rank_order(pp: int, r: int, n: int) -> list[tuple[OpKind, int]]:
    """(kind, chunk) of rank r's ops for n microbatches, in order; microbatches are
    numbered by the caller (each (kind, chunk) runs them in order)."""
    order = ([(F, 0)] * (2 * (pp - r) - 1) + [(F, 1), (F, 0)] * r
             + [(F, 1), (I, 1), (W, 1)] * (pp - r))
    for k in range(n - pp):
        order += [(F, 0)] * (k < n - 2 * pp + r + 1) + [(I, 0), (W, 0), (F, 1), (I, 1), (W, 1)]
    order += [(I, 0), (I, 1)] * r + [(I, 0), (W, 0)] * (pp - r) + [(W, 1)] * r + [(W, 0)] * r
    return order


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    pp = len(rank_stages)
    n = max(microbatches, 2 * pp - 1)
    out = []
    for r, stages in enumerate(rank_stages):
        count: dict[tuple[OpKind, int], int] = {}
        program = []
        for kind, chunk in rank_order(pp, r, n):
            m = count[kind, chunk] = count.get((kind, chunk), -1) + 1
            if m < microbatches:
                program.append(Op(kind, stages[chunk], m))
        out.append(program)
    return out


SCHEDULES = [ScheduleEntry(
    "zbv-zero-bubble", programs, source="Qi et al., ICLR 2024 (arXiv 2401.10241), section 6",
    summary="zero bubble over a V of two chunks per rank, 1F1B's peak memory on every rank",
    aliases=("ScheduleZBVZeroBubble", "ZBVZeroBubble", "zb-v", "zbv"),
    default_vpp=2, min_vpp=2, max_vpp=2, placement=V_SHAPE)]
