"""Per-rank memory accounting for the replay, and the OOM report of a simulated Timeline.

Units: bytes. The replay's MemoryModel (sim.engine) holds `static` bytes per pipeline rank
all iteration and adds each stage's activations from its forward to its backward. Static =
model states per ZeRO stage and communication buffers, from schedules.memory_model (ZeRO,
Rajbhandari et al. SC20, section 5.1: (2+2+K)Psi unsharded, down to (2+2+K)Psi/N for
ZeRO-3; K = 12 for mixed-precision Adam, 16 under fp16 with its fp32 gradient copy:
schedules.memory_model.optimizer_memory_bytes), at no activations in flight. Activations per
microbatch come from the ModelSpec (Korthikanti et al. 2022) via the plan's stage costs,
less ZeRO-R's partitioned checkpoints (schedules.activation_partition).
ZeRO-3 / FSDP gathered parameters are tracked op by op (`gathered_bytes`) instead of the
memory model's estimate when the lowered schedule gathers parameters.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from clustersim.schedules.activation_partition import stage_activation_bytes
from clustersim.schedules.contract import is_parameter_gather
from clustersim.schedules.memory_model import RankMemory
from clustersim.schedules.names import DP
from clustersim.schedules.ops import Op
from clustersim.schedules.plan import Plan
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.timeline import Timeline

from .engine import MemoryModel


def gathered_bytes(plan: Plan) -> Callable[[Op], int]:
    """Bytes a ZeRO-3 / FSDP parameter gather (chunk set) holds until its last user ends:
    the layer group's unsharded 16-bit parameters, i.e. its nbytes, or for a ZeRO++ qwZ
    int8 gather (group 'dp', one byte per parameter) nbytes * dtype bytes once dequantized.
    ZeRO-1/2 gathers (whole stage, or a layer group's with overlap_param_gather) refill
    always-resident parameters: nothing extra."""
    scale = plan.model.dtype_bytes if plan.parallel.quantized_weights else 1
    sharded_parameters = plan.parallel.zero_stage == 3

    def held(op: Op) -> int:
        if op.chunk is None or not sharded_parameters:
            return 0
        return op.nbytes * (scale if op.group == DP else 1)

    return held


def memory_model(lowered: Schedule, plan: Plan, breakdown: Sequence[RankMemory]
                 ) -> MemoryModel:
    """The replay's memory of `lowered`: static bytes per pipeline rank from `breakdown`
    (schedules.memory_model.rank_memory of the plan at no activations in flight: model
    states, buffers, FSDP-with-a-pipeline's unsharded gradients and the full-recompute
    working set (held all iteration: it counts at
    the peak, which falls in a backward), and its estimate of ZeRO-3's gathered
    parameters unless the schedule gathers parameters, which the replay then tracks),
    activations per stage."""
    activations = stage_activation_bytes(plan)[0]
    tracked = any(is_parameter_gather(op) for op in lowered.ops())
    static = [round(r.model_states_bytes + r.communication_buffers + r.recompute_working
                    + r.unsharded_gradients + (0 if tracked else r.gathered_parameters))
              for r in breakdown]
    if not tracked:
        return MemoryModel(static, activations)
    return MemoryModel(static, activations, gathered=gathered_bytes(plan))


def oom_report(timeline: Timeline, breakdown: Sequence[RankMemory],
               capacity: float) -> list[dict]:
    """One entry per pipeline rank whose simulated peak exceeds `capacity` bytes: the
    rank, the time of the peak, and the breakdown at the peak. Model states and buffers
    come from `breakdown`; the rest of the peak is ZeRO-3 gathered parameters (at most
    `breakdown`'s estimate) and activations."""
    peaks, times = timeline.peak_memory(), timeline.peak_memory_times()
    report = []
    for rank, peak in sorted(peaks.items()):
        if peak <= capacity or rank >= len(breakdown):
            continue
        parts = breakdown[rank]
        held = max(peak - parts.model_states_bytes - parts.communication_buffers
                   - parts.recompute_working - parts.unsharded_gradients, 0.0)
        gathered = min(parts.gathered_parameters, held)
        report.append({
            "rank": rank, "time_s": times[rank], "peak_bytes": peak,
            "capacity_bytes": capacity, "over_bytes": peak - capacity,
            "parameters_bytes": parts.parameters, "gradients_bytes": parts.gradients,
            "optimizer_states_bytes": parts.optimizer_states,
            "hpz_secondary_bytes": parts.hpz_secondary,
            "fp8_weights_bytes": parts.fp8_weights,
            "stashed_weights_bytes": parts.stashed_weights,
            "communication_buffers_bytes": parts.communication_buffers,
            "recompute_working_bytes": parts.recompute_working,
            "gathered_parameters_bytes": gathered,
            "unsharded_gradients_bytes": parts.unsharded_gradients,
            "activations_bytes": held - gathered,
            "host_bytes": parts.host,
        })
    return report
