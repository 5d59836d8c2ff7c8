"""Layer groups that need not divide a stage's layers (schedules.layer_groups): ZeRO-3 / FSDP
on an uneven pipeline split (the embedding and the loss taking a layer slot, as Llama 3 and
torchtitan split 126 layers) runs one unit per layer, G = the most layers a stage holds."""
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from clustersim.schedules.costs import costs_for_layers
from clustersim.schedules.data_parallel import add_data_parallel
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_groups import chunk_layers, chunk_parts, group_costs
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import WORK_KINDS, Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.validate import validate

SLOTS = dict(account_for_embedding=True, account_for_loss=True)
MIDDLE_SHORT = dict(first_stage_layers=4, last_stage_layers=4)  # 10 layers on pp=3: 4, 2, 4


def _zero3(num_layers, pp, microbatches=3, **kw):
    """(plan, schedule with the ZeRO-3 pass) of a 1F1B pipeline on `pp` ranks."""
    parallel = ParallelConfig(pp=pp, dp=4, num_microbatches=microbatches, zero_stage=3, **kw)
    plan = resolve(get_model("llama3-8b", num_layers=num_layers), parallel)
    schedule = add_data_parallel(build_schedule("1f1b", pp, microbatches), plan)
    validate(schedule)
    return plan, schedule


def _units(plan) -> set[tuple[int, int]]:
    """(stage, group) of the groups that run a layer, the embedding or the head."""
    groups = plan.layer_groups
    return {(s, g) for s in range(plan.num_stages) for g in range(groups)
            if (p := chunk_parts(plan.stage_layers, s, g, groups)).layers or p.embedding
            or p.head}


@pytest.mark.parametrize("counts", [(3, 4, 4, 3), (15, 16, 16, 16, 16, 16, 16, 15), (4, 2, 4),
                                    (1, 4), (2, 3, 3), (4, 4)])
def test_every_layer_is_in_exactly_one_group_of_its_stage(counts):
    groups, offset = max(counts), 0
    for s, layers in enumerate(counts):
        parts = [chunk_parts(counts, s, g, groups) for g in range(groups)]
        assert [i for p in parts for i in p.layers] == list(range(offset, offset + layers))
        assert all(len(p.layers) <= 1 for p in parts)
        assert [g for g, p in enumerate(parts) if p.embedding] == ([0] if s == 0 else [])
        assert [g for g, p in enumerate(parts) if p.head] == \
            ([groups - 1] if s == len(counts) - 1 else [])
        offset += layers


def test_a_stage_short_of_a_slot_gives_embedding_and_head_their_own_group():
    # torchtitan's FSDP2 units: tok_embeddings, each block, [norm, output]
    counts = (3, 4, 4, 3)
    first, last = chunk_parts(counts, 0, 0, 4), chunk_parts(counts, 3, 3, 4)
    assert first.embedding and not first.layers and not first.head
    assert last.head and not last.layers and not last.embedding
    assert list(chunk_parts(counts, 0, 1, 4).layers) == [0]
    assert list(chunk_parts(counts, 3, 2, 4).layers) == [13]


def test_groups_divide_a_stage_evenly_or_hold_one_layer_or_none():
    assert list(chunk_layers(8, 4, 1)) == [2, 3]
    assert [list(chunk_layers(2, 4, g)) for g in range(4)] == [[0], [1], [], []]
    assert [list(chunk_layers(2, 4, g, first=True)) for g in range(4)] == [[], [], [0], [1]]
    with pytest.raises(ConfigError, match="divide the 8 layers"):
        chunk_layers(8, 3, 0)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("layers, pp, split", [(14, 4, SLOTS), (10, 3, MIDDLE_SHORT)])
def test_group_costs_sum_to_their_stage(recompute, layers, pp, split):
    model = get_model("llama3-8b", num_layers=layers)
    parallel = ParallelConfig(pp=pp, dp=2, zero_stage=3, recompute=recompute, **split)
    plan = resolve(model, parallel)
    assert plan.layer_groups == max(plan.stage_layers) == 4
    assert len(set(plan.stage_layers)) > 1
    stages = costs_for_layers(model, parallel, plan.stage_layers)
    groups = group_costs(model, parallel, plan.stage_layers, plan.layer_groups)
    for stage, row in zip(stages, groups):
        assert sum(c.layers for c in row) == stage.layers
        for field in ("forward_flops", "backward_flops", "param_count", "grad_bytes",
                      "activation_bytes"):
            assert sum(getattr(c, field) for c in row) == \
                pytest.approx(getattr(stage, field), rel=1e-9), field


def test_profile_times_of_groups_sum_to_their_stage():
    from clustersim.sim.profile_cost import ProfileCost
    from tests.test_profile import make_profile
    profile = make_profile()
    whole = ProfileCost(profile, [3, 4, 4, 3])
    grouped = ProfileCost(profile, [3, 4, 4, 3], groups=4)
    for s in range(4):
        for kind in (OpKind.F, OpKind.B):
            parts = sum(grouped(Op(kind, s, 0, chunk=g)) for g in range(4))
            assert parts == pytest.approx(whole(Op(kind, s, 0)))


@pytest.mark.parametrize("layers, pp, split", [(14, 4, SLOTS), (10, 3, MIDDLE_SHORT)])
def test_one_gather_and_one_reduce_scatter_per_fsdp_unit(layers, pp, split):
    # with a pipeline and no reshard after forward every unit is gathered once per step
    plan, schedule = _zero3(layers, pp, reshard_after_forward=False, **split)
    units = _units(plan)
    if split is SLOTS:  # torchtitan: one unit per block, tok_embeddings, [norm, output]
        assert len(units) == layers + 2 == pp * plan.layer_groups
    gathered, reduced = [], []
    for rank, program in enumerate(schedule.programs):
        gathers = [op for op in program if op.kind is OpKind.ALL_GATHER]
        gathered += [(op.stage, op.chunk) for op in gathers]
        reduced += [(op.stage, op.chunk) for op in program if op.kind is OpKind.REDUCE_SCATTER]
        for s in plan.stages_of(rank):  # the stage's parameters, each once
            c = plan.stage_costs[s]
            assert sum(op.nbytes for op in gathers if op.stage == s) == \
                (c.param_count + c.tied_param_count) * plan.model.dtype_bytes
    assert sorted(gathered) == sorted(reduced) == sorted(units)


def test_prefetch_passes_over_groups_without_parameters():
    plan, schedule = _zero3(10, 3, reshard_after_forward=True, **MIDDLE_SHORT)
    assert plan.stage_layers == (4, 2, 4)
    units = _units(plan)
    assert (1, 2) not in units and (1, 3) not in units
    program = schedule.programs[1]
    for index, op in enumerate(program):
        if op.kind is OpKind.ALL_GATHER:
            after = next(o for o in program[index:] if o.kind is not OpKind.ALL_GATHER)
            assert after.kind in WORK_KINDS and (after.stage, after.chunk) in units, op
    text = " ".join(map(str, program))
    assert "1ALL_GATHER1.0 1F0.1 1F0.2 1F0.3 " in text  # posted a unit ahead


def test_uneven_zero3_simulates():
    from clustersim.sim.simulate import simulate
    from clustersim.topologies import load_topology
    parallel = ParallelConfig(pp=4, dp=2, num_microbatches=4, zero_stage=3, **SLOTS)
    timeline = simulate(get_model("llama3-8b", num_layers=14), parallel,
                        load_topology("dgx-h100"))
    assert timeline.iteration_time > 0


def test_llama3_8k_gpu_fidelity_row_simulates():
    # refused before: "layer_groups=3 must divide the 4 layers of a stage"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import fidelity_hopper as fh
    import fidelity_hopper_data as hd
    from clustersim.sim.cost_model import RooflineCostModel
    run = next(r for r in hd.PUBLISHED_RUNS if fh.row_id(r) == "LLAMA3:8K GPUs, 8K seq")
    plan = resolve(fh.model_spec(run), fh.parallel_config(run))
    assert (plan.stage_layers[0], plan.stage_layers[1], plan.layer_groups) == (3, 4, 4)
    name, spec, _ = fh.topology_for(run)
    row = fh.simulate_row(run, fh.build_topology(name, spec), RooflineCostModel())
    assert row["predicted_s"] > 0


def _kernels_step_equals_reference(num_layers, pp, **split):
    """Run one ZeRO-3 step of a tiny 1F1B pipeline on the kernels backend (gloo, CPU) and
    compare it with the single-process reference; returns the plan."""
    kz = pytest.importorskip("tests.test_kernels_zero")
    model = replace(kz.LLAMA, num_layers=num_layers)
    parallel = ParallelConfig(pp=pp, dp=2, micro_batch_size=2, num_microbatches=2,
                              zero_stage=3, **split)
    base = build_schedule("1f1b", pp, 2)
    plan = resolve(model, parallel, schedule=base)
    schedule = add_data_parallel(base, plan)
    timeline, grads, params = kz.run(schedule, parallel, model=model)
    kz.assert_matches_reference(grads, params, parallel, model=model)
    kz.assert_collectives_as_programmed(timeline, schedule, parallel)
    return plan


def test_kernels_run_an_uneven_zero3_pipeline_as_one_process():
    plan = _kernels_step_equals_reference(3, 2, account_for_embedding=True)
    assert (plan.stage_layers, plan.layer_groups) == ((1, 2), 2)


def test_kernels_run_a_zero3_pipeline_with_a_middle_stage_short_of_layers():
    _kernels_step_equals_reference(5, 3, first_stage_layers=2, last_stage_layers=2)
