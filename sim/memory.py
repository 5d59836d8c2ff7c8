"""Per-rank memory accounting for the replay, and the OOM report of a simulated Timeline.

Units: bytes. The replay's MemoryModel (sim.engine) holds `static` bytes per pipeline rank
all iteration and adds each stage's activations from its forward to its backward. Static =
model states per ZeRO stage and communication buffers, from schedules.memory_model (ZeRO,
Rajbhandari et al. SC20, section 5.1: (2+2+K)Psi unsharded, down to (2+2+K)Psi/N for
ZeRO-3; K = 12 for mixed-precision Adam). Without a ModelSpec and ParallelConfig it falls
back to 16 bytes per parameter, ZeRO stage 0. Activations per microbatch come from the
ModelSpec (Korthikanti et al. 2022) via schedules.costs.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import networkx as nx

from clustersim.schedules.costs import StageCost
from clustersim.schedules.memory_model import MIXED_PRECISION_K, RankMemory, rank_memory
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ops import Op
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.timeline import Timeline
from clustersim.topologies import gpu_nodes, host_of

from .engine import MemoryModel

MODEL_STATE_BYTES_PER_PARAM = 2 + 2 + MIXED_PRECISION_K  # ZeRO stage 0


def memory_model(schedule: Schedule, costs: Sequence[StageCost], model: ModelSpec | None = None,
                 parallel: ParallelConfig | None = None, gpus_per_node: int | None = None,
                 gathered: Callable[[Op], int] | None = None) -> MemoryModel:
    """Static bytes per pipeline rank and activation bytes per stage. With `model` and
    `parallel`, static = model states per ZeRO stage + gradient buckets of
    schedules.memory_model, plus its estimate of ZeRO-3's gathered parameters unless
    `gathered` (bytes a parameter ALL_GATHER holds, tracked op by op by the replay) is
    given. Without them: 16 bytes per parameter held (a tied embedding twice)."""
    activations = [c.activation_bytes for c in costs]
    if model is None or parallel is None:
        static = [0] * schedule.num_ranks
        for stage, cost in enumerate(costs):
            params = cost.param_count + cost.tied_param_count
            static[schedule.rank_of_stage(stage)] += MODEL_STATE_BYTES_PER_PARAM * params
        return MemoryModel(static, activations)
    ranks = rank_memory(model, parallel, schedule=schedule, gpus_per_node=gpus_per_node,
                        in_flight=[0] * schedule.num_stages)
    static = [round(r.model_states_bytes + r.communication_buffers
                    + (0 if gathered else r.gathered_parameters)) for r in ranks]
    if gathered is None:
        return MemoryModel(static, activations)
    return MemoryModel(static, activations, gathered=gathered)


def gpus_per_node(topology: nx.DiGraph) -> int:
    """GPUs on the host of the topology's first GPU (the size of hybrid and hpZ groups)."""
    gpus = gpu_nodes(topology)
    host = host_of(topology, gpus[0])
    return sum(1 for gpu in gpus if host_of(topology, gpu) == host)


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
        held = max(peak - parts.model_states_bytes - parts.communication_buffers, 0.0)
        gathered = min(parts.gathered_parameters, held)
        report.append({
            "rank": rank, "time_s": times[rank], "peak_bytes": peak,
            "capacity_bytes": capacity, "over_bytes": peak - capacity,
            "parameters_bytes": parts.parameters, "gradients_bytes": parts.gradients,
            "optimizer_states_bytes": parts.optimizer_states,
            "hpz_secondary_bytes": parts.hpz_secondary,
            "communication_buffers_bytes": parts.communication_buffers,
            "gathered_parameters_bytes": gathered,
            "activations_bytes": held - gathered,
            "host_bytes": parts.host,
        })
    return report
