"""PipeDream and PipeDream-2BW: 1F1B with no flush, each microbatch's backward on the
weight version its forward used (weight stashing; the rules, the steady state and the
closed forms: schedules.weight_stashing). The program is 1F1B's order over the K batches
of M microbatches the steady state needs, with no flush between batches; the
data-parallel pass adds each stage's gradient reduction and optimizer step after the
backward that ends each update (every microbatch for PipeDream, every batch for 2BW)."""
from __future__ import annotations

from ..ops import Op
from ..schedule_entry import ScheduleEntry
from ..weight_stashing import PIPEDREAM, TWO_BW, WeightStashing, two_bw_microbatch_rule
from . import one_f_one_b


def programs(rank_stages: list[list[int]], microbatches: int) -> list[list[Op]]:
    """1F1B's order over `microbatches` (all K batches of the run): no flush between them."""
    return one_f_one_b.programs(rank_stages, microbatches)


SCHEDULES = [
    ScheduleEntry(
        "pipedream", programs, source="Narayanan et al., SOSP 2019 (PipeDream)",
        summary="asynchronous 1F1B, no flush, a weight update per microbatch, up to pp "
                "stashed weight versions",
        aliases=("pipedream-async", "async-1f1b"),
        stashing=WeightStashing(PIPEDREAM)),
    ScheduleEntry(
        "pipedream-2bw", programs, source="Narayanan et al., ICML 2021 (PipeDream-2BW)",
        summary="1F1B with no flush, one update per batch of M >= pp microbatches, two "
                "weight versions (staleness 1)",
        aliases=("2bw", "double-buffered-weights"),
        stashing=WeightStashing(TWO_BW), microbatch_rule=two_bw_microbatch_rule),
]
