"""Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on
GPU Clusters using Megatron-LM", SC21; Megatron-LM's
`forward_backward_pipelining_with_interleaving`, torch.distributed.pipelining's
ScheduleInterleaved1F1B): rank r holds V model chunks (stages r, r+P, ..., r+(V-1)P, the
loop placement); microbatches go through the chunks in groups of P; warm-up is
2(P-r-1) + (V-1)P forwards. Unit-time makespan 2(VM + P - 1) in chunk steps.

Megatron-LM and SC21 (section 2.2.2) need M a multiple of P. torch's
ScheduleInterleaved1F1B also runs any M that its R = max(1, M // P) rounds divide
(pytorch/pytorch#129597), in groups of G = M / R microbatches, with warm-up
2(P-r-1) + (V-1)G: so does this (rounds, group, microbatch_rule), and for M a multiple of P
it is Megatron's schedule (G = P)."""
from __future__ import annotations

from ..ops import Op, OpKind
from ..schedule_entry import ScheduleEntry


def rounds(pp: int, microbatches: int) -> int:
    """torch's rounds of microbatches: max(1, M // P)."""
    return max(1, microbatches // pp)


def group(pp: int, microbatches: int) -> int:
    """Microbatches per round, G = M / rounds (P when M is a multiple of P)."""
    return microbatches // rounds(pp, microbatches)


def microbatch_rule(pp: int, microbatches: int) -> str | None:
    """Why torch refuses this microbatch count (its rounds must divide it), or None."""
    n = rounds(pp, microbatches)
    if microbatches % n == 0:
        return None
    below = n * (microbatches // n)  # the neighbours accepted with n rounds, or
    above = min(n * -(-microbatches // n), (n + 1) * pp)  # n + 1 rounds of pp
    return (f"it runs microbatches in max(1, microbatches // pp) = {n} equal rounds (torch's "
            f"interleaved schedules; a multiple of pp as in Megatron-LM always works): "
            f"microbatches must be a multiple of {n}, got {microbatches} with pp={pp} "
            f"(e.g. {below} or {above})")


def chunk_and_microbatch(k: int, size: int, vpp: int, forward: bool) -> tuple[int, int]:
    """Chunk and microbatch of a rank's k-th forward (or backward) op in groups of `size`
    microbatches: ops 0..size-1 are microbatches 0..size-1 on chunk 0, the next size on
    chunk 1, ..., then the next group. Backwards visit the chunks in reverse."""
    chunk = (k // size) % vpp
    if not forward:
        chunk = vpp - 1 - chunk
    microbatch = (k // (size * vpp)) * size + k % size
    return chunk, microbatch


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    pp, vpp = len(rank_stages), len(rank_stages[0])
    total, size = microbatches * vpp, group(pp, microbatches)
    out = []
    for r, chunks in enumerate(rank_stages):
        def op(kind: OpKind, k: int) -> Op:
            chunk, m = chunk_and_microbatch(k, size, vpp, kind is OpKind.F)
            return Op(kind, chunks[chunk], m)

        warmup = min(2 * (pp - r - 1) + (vpp - 1) * size, total)
        program = [op(OpKind.F, k) for k in range(warmup)]
        for i in range(total - warmup):
            program += [op(OpKind.F, warmup + i), op(OpKind.B, i)]
        program += [op(OpKind.B, k) for k in range(total - warmup, total)]
        out.append(program)
    return out


SCHEDULES = [ScheduleEntry(
    "interleaved-1f1b", programs, source="Narayanan et al., SC21",
    summary="1F1B over V model chunks per rank, microbatches in groups of pp (or torch's "
            "rounds)",
    aliases=("ScheduleInterleaved1F1B", "interleaved", "interleaved1f1b"),
    default_vpp=2, min_vpp=2, max_vpp=None, microbatch_rule=microbatch_rule)]
