"""Layer groups: the layer -> group map and group costs (annotate, profile costs)."""
import pytest

from clustersim.schedules.annotate import annotate
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_groups import chunk_layers, group_costs
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import Op, OpKind, parse_op
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.torch_csv import to_torch_csv

MODEL = get_model("llama3-8b", num_layers=8)


def test_chunk_layers():
    assert list(chunk_layers(8, 4, 1)) == [2, 3] and list(chunk_layers(8, 4, None)) == list(range(8))
    with pytest.raises(ConfigError, match="divide"):
        chunk_layers(8, 3, 0)


@pytest.mark.parametrize("pp", [1, 2])
def test_groups_sum_to_their_stage_and_carry_embedding_and_head(pp):
    parallel = ParallelConfig(pp=pp)
    plan = resolve(MODEL, parallel)
    stages = plan.stage_costs
    assert plan.stage_layers == (8 // pp,) * pp
    groups = group_costs(MODEL, parallel, plan.stage_layers, 2)
    for s, row in enumerate(groups):
        for field in ("forward_flops", "backward_flops", "grad_bytes", "param_count"):
            assert sum(getattr(c, field) for c in row) == pytest.approx(getattr(stages[s], field))
    layer = MODEL.layer_param_count(1, 1) * 4 // pp // 2
    assert groups[0][0].param_count > layer  # embedding with group 0 of stage 0
    assert groups[-1][-1].param_count > layer  # head with the last group of the last stage


def test_annotate_costs_chunks_as_their_group():
    # the plan's layer groups are those of its data-parallel pass: buckets of 4 layers'
    # gradients make 2 groups of the 8 layers
    bucket = 4 * MODEL.layer_param_count(1, 1) * MODEL.dtype_bytes
    parallel = ParallelConfig(pp=1, dp=2, bucket_bytes=bucket)
    program = [parse_op(t) for t in "0F0.0 0F0.1 0B0.1 0B0.0".split()]
    schedule = Schedule("x", 1, [program], 1, layer_groups=2)
    groups = group_costs(MODEL, parallel, [8], 2)
    plan = resolve(MODEL, parallel)
    assert plan.layer_groups == 2
    costed = annotate(schedule, plan).programs[0]
    assert [op.flops for op in costed] == [groups[0][0].forward_flops, groups[0][1].forward_flops,
                                           groups[0][1].backward_flops, groups[0][0].backward_flops]
    # a plan without costs for 2 groups per stage (one layer per group: G = 8) refuses
    with pytest.raises(ConfigError, match="layer groups"):
        annotate(schedule, resolve(MODEL, ParallelConfig(pp=1, dp=2)))
    with pytest.raises(ConfigError, match="layer group"):
        to_torch_csv(schedule)


def test_profile_costs_a_group_as_its_layers():
    from tests.test_profile import make_profile
    from clustersim.sim.profile_cost import ProfileCost
    profile = make_profile()
    whole = ProfileCost(profile, [4, 4])
    grouped = ProfileCost(profile, [4, 4], groups=2)
    for s in (0, 1):
        for kind in (OpKind.F, OpKind.B):
            parts = sum(grouped(Op(kind, s, 0, chunk=g)) for g in (0, 1))
            assert parts == pytest.approx(whole(Op(kind, s, 0)))
    assert grouped(Op(OpKind.I, 0, 0, chunk=0)) == pytest.approx(profile.compute_time("embedding", "I"))
