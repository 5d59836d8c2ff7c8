"""The automatic zero-bubble schedule (schedules.zero_bubble_auto; Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR 2024, section 3): one chunk per rank, F, I and W ordered for
the run's own simulated stage and P2P times under a per-rank activation-memory limit
(`--activation-memory-limit`, default: what the device has left). Its order exists only
for a run with costs, so the registry entry is built_from_costs and sim.auto_schedule
builds it."""
from __future__ import annotations

from ..errors import ConfigError
from ..ops import Op
from ..schedule_entry import ScheduleEntry


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    raise ConfigError("schedule 'zb-auto' needs a run's simulated costs (sim.auto_schedule)")


SCHEDULES = [ScheduleEntry(
    "zb-auto", programs, source="Qi et al., ICLR 2024, section 3 (automatic scheduling)",
    summary="zero bubble built for this run's simulated F, I, W and P2P times under a "
            "memory limit",
    aliases=("auto-zero-bubble", "zero-bubble-auto", "zbauto"), built_from_costs=True)]
