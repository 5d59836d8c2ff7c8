"""Per-rank memory accounting for the replay (bytes).

Model states with mixed-precision Adam and no sharding take 16 bytes per parameter:
2 (16-bit weights) + 2 (16-bit gradients) + 12 (fp32 master weights, momentum, variance)
— Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC20, section 3.1. Activations per in-flight microbatch come from the ModelSpec
(Korthikanti et al. 2022) via schedules.costs.
"""
from __future__ import annotations

from collections.abc import Sequence

from schedules.costs import StageCost
from schedules.schedule import Schedule

from .engine import MemoryModel

MODEL_STATE_BYTES_PER_PARAM = 16


def memory_model(schedule: Schedule, costs: Sequence[StageCost]) -> MemoryModel:
    """Static model-state bytes per pipeline rank and activation bytes per stage."""
    static = [0] * schedule.num_ranks
    for stage, cost in enumerate(costs):
        params = cost.param_count + cost.tied_param_count  # a tied embedding is held twice
        static[schedule.rank_of_stage(stage)] += MODEL_STATE_BYTES_PER_PARAM * params
    return MemoryModel(static, [c.activation_bytes for c in costs])
