"""DualPipe, bidirectional (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437,
section 3.2.1; github.com/deepseek-ai/DualPipe `dualpipe.py`, read op by op in
docs/research/dualpipe_bidirectional.md).

The model's P stages exist twice (P even): direction 0 feeds microbatches 0..M/2-1 in at
rank 0 through stages 0..P-1 on ranks 0..P-1; direction 1 feeds M/2..M-1 in at rank P-1
through a second copy, model stage j as virtual stage P + j on rank P-1-j (the V
placement: rank r holds stage r and stage 2P-1-r; schedules.chains). So every rank holds
two stages' parameters (DeepSeek's "2x"), and the two copies of a stage sum their
gradients before the step (schedules.data_parallel.copy_ops).

Rank r's order is DualPipeV's (schedules.pipelines.dualpipe_v) for P/2 ranks at rank
h = min(r, P-1-r), its first stage being the one of the direction that enters at r's end
of the pipeline ("near": direction 0 for r < P/2) and its second the other ("far"), with
M/2 microbatches per direction: the eight phases of DeepSeek's `DualPipe.step`. The
closed forms of DeepSeek's README table (PP = P stages): bubble (PP/2-1)(F&B+B-3W), the
same as DualPipeV's; 2x parameters per device; PP+1 microbatches' activations per device.
It needs P even, M even and M >= 2P (DeepSeek's asserts).
"""
from __future__ import annotations

from dataclasses import replace

from ..ops import Op
from ..placement import V_SHAPE
from ..schedule_entry import ScheduleEntry
from .dualpipe_v import rank_program


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    pp = len(rank_stages)
    half, per_direction = pp // 2, microbatches // 2
    out = []
    for r, (down, up) in enumerate(rank_stages):  # direction 0's stage r, direction 1's
        near, far = (down, up) if r < half else (up, down)
        program = rank_program(half, per_direction, min(r, pp - 1 - r), near, far)
        out.append([op if op.stage < pp else replace(op, microbatch=op.microbatch
                                                     + per_direction) for op in program])
    return out


def microbatch_rule(pp: int, microbatches: int) -> str | None:
    if pp % 2:
        return f"its two directions need an even pp (DeepSeek's DualPipe), got pp={pp}"
    if microbatches % 2 or microbatches < 2 * pp:
        return (f"it feeds half the microbatches from each end: M must be even and at least "
                f"2 * pp = {2 * pp} (DeepSeek's DualPipe), got {microbatches}")
    return None


SCHEDULES = [ScheduleEntry(
    "dualpipe", programs, source="DeepSeek-V3 report, section 3.2.1; deepseek-ai/DualPipe",
    summary="bidirectional: two copies of the model's stages, half the microbatches fed "
            "from each end, forward and backward pairs (run F then B here); M >= 2pp, "
            "pp even",
    aliases=("dual-pipe", "DualPipe-bidirectional"), default_vpp=2, min_vpp=2, max_vpp=2,
    placement=V_SHAPE, microbatch_rule=microbatch_rule, chains=2)]
