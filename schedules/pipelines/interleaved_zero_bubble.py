"""Interleaved zero bubble (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv
2401.10241: the ZB-H1 order over several model chunks; torch.distributed.pipelining's
ScheduleInterleavedZeroBubble, whose per-rank F/I/W order this reproduces).

Rank r of P holds V chunks (stages r, r+P, ..., the loop placement) and runs M
microbatches in R = max(1, M // P) rounds of G = M / R microbatches (torch refuses M
that R does not divide, e.g. M = 9 with P = 4), as interleaved 1F1B does in torch
(schedules.pipelines.interleaved: rounds, group, microbatch_rule). Forwards go through the chunks G
microbatches at a time (microbatches 0..G-1 on chunk 0, then on chunk 1, ..., then the
next round); input-gradient backwards (I) do the same over the chunks in reverse. With
f_k, i_k and w_k the rank's k-th F, I and W (w_k is i_k's weight gradient):
- warm-up: f_0 .. f_{n-1}, n = min((V-1)G + P-1-r, VM);
- step k = 0 .. VM-1: f_{n+k} (while forwards remain), i_k, then w_{k-r} once k >= r
  (rank r defers its weight gradients by r steps: they fill the bubbles 1F1B leaves);
- the last min(r, VM) weight gradients at the end, in order.
Every rank then holds at most min((V-1)G + P, VM) microbatch-chunks (F until W), with V = 1
ZB-H1's bound: no more than 1F1B's first rank, P.
"""
from __future__ import annotations

from ..ops import Op, OpKind
from ..schedule_entry import ScheduleEntry
from .interleaved import chunk_and_microbatch, group, microbatch_rule


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    pp, vpp = len(rank_stages), len(rank_stages[0])
    size, total = group(pp, microbatches), vpp * microbatches

    def nth(k: int, chunks: list[int], reverse: bool) -> tuple[int, int]:
        """(stage, microbatch) of a rank's k-th forward (or backward, `reverse`)."""
        chunk, m = chunk_and_microbatch(k, size, vpp, not reverse)
        return chunks[chunk], m

    out = []
    for r, chunks in enumerate(rank_stages):
        forwards = [Op(OpKind.F, *nth(k, chunks, False)) for k in range(total)]
        inputs = [Op(OpKind.I, *nth(k, chunks, True)) for k in range(total)]
        weights = [Op(OpKind.W, op.stage, op.microbatch) for op in inputs]
        warmup = min((vpp - 1) * size + pp - 1 - r, total)
        program = forwards[:warmup]
        for k in range(total):
            program += forwards[warmup + k:warmup + k + 1] + [inputs[k]]
            program += [weights[k - r]] if k >= r else []
        out.append(program + weights[max(total - r, 0):])
    return out


SCHEDULES = [ScheduleEntry(
    "interleaved-zero-bubble", programs, source="Qi et al., ICLR 2024 (arXiv 2401.10241)",
    summary="ZB-H1 over V chunks per rank: F, I, then a deferred W; microbatches a multiple "
            "of max(1, microbatches // pp)",
    aliases=("ScheduleInterleavedZeroBubble", "InterleavedZeroBubble", "interleaved-zb"),
    default_vpp=2, min_vpp=1, max_vpp=None, microbatch_rule=microbatch_rule)]
