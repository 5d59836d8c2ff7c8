"""The one lowering: its passes in order, a schedule accepted at any stage, and lowering a
lowered schedule changing nothing (even where a late pass adjusts an earlier one's costs:
scattered P2P bytes, imbalanced experts' FLOPs)."""
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import PASSES, lower
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.registry import build_schedule

GPT = get_model("gpt3-1.3b", num_layers=8)
MIXTRAL = get_model("mixtral-8x7b", num_layers=4)


def test_the_passes_in_order():
    assert [p.name for p in PASSES] == ["structure", "data-parallel", "p2p", "costs",
                                        "intra-layer"]


@pytest.mark.parametrize("model, parallel", [
    (GPT, ParallelConfig(pp=2, tp=2, dp=2, num_microbatches=4, scatter_gather=True)),
    (GPT, ParallelConfig(pp=2, dp=2, zero_stage=1, num_microbatches=4)),
    (GPT, ParallelConfig(pp=1, dp=4, fsdp="full", num_microbatches=2)),
    (MIXTRAL, ParallelConfig(pp=2, dp=2, ep=2, num_microbatches=2, moe_imbalance=2.0)),
])
def test_lowering_a_lowered_schedule_changes_nothing(model, parallel):
    plan = resolve(model, parallel)
    once = lower(plan.build_schedule(), plan)
    assert lower(once, plan).programs == once.programs


def test_scattered_transfers_carry_a_tp_share_and_are_gathered():
    """SC21 4.1: each of t TP ranks sends 1/t of the boundary; the receiver all-gathers."""
    parallel = ParallelConfig(pp=2, tp=2, num_microbatches=2, scatter_gather=True)
    plan = resolve(GPT, parallel)
    lowered = lower(plan.build_schedule(), plan)
    boundary = plan.stage_costs[0].boundary_bytes
    sends = [op for op in lowered.ops() if op.kind is OpKind.SEND_F]
    assert sends and all(op.nbytes == boundary // 2 for op in sends)
    gathers = [op for op in lowered.programs[1] if op.kind is OpKind.ALL_GATHER]
    assert len(gathers) == 2 and all(op.nbytes == boundary for op in gathers)


def test_a_schedule_of_another_shape_is_refused():
    plan = resolve(GPT, ParallelConfig(pp=2, num_microbatches=4))
    with pytest.raises(ConfigError, match="not the shape its plan was resolved for"):
        lower(build_schedule("1f1b", 2, 2), plan)
