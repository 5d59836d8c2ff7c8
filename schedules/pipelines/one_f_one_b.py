"""1F1B, PipeDream-Flush (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
Training", ICML 2021; Megatron-LM's `forward_backward_pipelining_without_interleaving`,
torch.distributed.pipelining's Schedule1F1B): rank r runs min(P-r-1, M) warm-up
forwards, then alternates one forward and one backward, then drains the remaining
backwards. Unit-time makespan as GPipe's, 2(M + P - 1); rank r holds min(P - r, M)
microbatches at its peak."""
from __future__ import annotations

from ..ops import Op, OpKind
from ..schedule_entry import ScheduleEntry


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    pp, out = len(rank_stages), []
    for r, (stage,) in enumerate(rank_stages):
        warmup = min(pp - r - 1, microbatches)
        program = [Op(OpKind.F, stage, m) for m in range(warmup)]
        for i in range(microbatches - warmup):
            program += [Op(OpKind.F, stage, warmup + i), Op(OpKind.B, stage, i)]
        program += [Op(OpKind.B, stage, m) for m in range(microbatches - warmup, microbatches)]
        out.append(program)
    return out


SCHEDULES = [ScheduleEntry(
    "1f1b", programs, source="Narayanan et al., ICML 2021 (PipeDream-Flush)",
    summary="warm-up forwards, then one forward and one backward in turn",
    aliases=("Schedule1F1B", "pipedream-flush"))]
