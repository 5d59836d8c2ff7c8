"""Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on
GPU Clusters using Megatron-LM", SC21; Megatron-LM's
`forward_backward_pipelining_with_interleaving`, torch.distributed.pipelining's
ScheduleInterleaved1F1B): rank r holds V model chunks (stages r, r+P, ..., r+(V-1)P, the
loop placement); microbatches go through the chunks in groups of P; warm-up is
2(P-r-1) + (V-1)P forwards. Unit-time makespan 2(VM + P - 1) in chunk steps."""
from __future__ import annotations

from ..ops import Op, OpKind
from ..schedule_entry import ScheduleEntry


def chunk_and_microbatch(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    """Chunk and microbatch of a rank's k-th forward (or backward) op: ops 0..P-1 are
    microbatches 0..P-1 on chunk 0, the next P on chunk 1, ..., then the next group of
    microbatches. Backwards visit the chunks in reverse."""
    chunk = (k // pp) % vpp
    if not forward:
        chunk = vpp - 1 - chunk
    microbatch = (k // (pp * vpp)) * pp + k % pp
    return chunk, microbatch


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    pp, vpp = len(rank_stages), len(rank_stages[0])
    total = microbatches * vpp
    out = []
    for r, chunks in enumerate(rank_stages):
        def op(kind: OpKind, k: int) -> Op:
            chunk, m = chunk_and_microbatch(k, pp, vpp, kind is OpKind.F)
            return Op(kind, chunks[chunk], m)

        warmup = min(2 * (pp - r - 1) + (vpp - 1) * pp, total)
        program = [op(OpKind.F, k) for k in range(warmup)]
        for i in range(total - warmup):
            program += [op(OpKind.F, warmup + i), op(OpKind.B, i)]
        program += [op(OpKind.B, k) for k in range(total - warmup, total)]
        out.append(program)
    return out


SCHEDULES = [ScheduleEntry(
    "interleaved-1f1b", programs, source="Narayanan et al., SC21",
    summary="1F1B over V model chunks per rank, microbatches in groups of pp",
    aliases=("ScheduleInterleaved1F1B", "interleaved", "interleaved1f1b"),
    default_vpp=2, min_vpp=2, max_vpp=None, microbatches_multiple_of_pp=True)]
