"""Sharded optimizers with pipeline parallelism (issue 16 item 6): ZeRO-2 as Megatron-FSDP's
optim_grads, ZeRO-3 / FSDP / HSDP as FSDP2 under torch.distributed.pipelining (torchtitan),
against the frameworks' closed forms: memory (ZeRO paper), every op once, the collectives
per step and stage, and what is still refused."""
import math

import pytest

from clustersim.schedules.data_parallel import add_data_parallel
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import (MIXED_PRECISION_K, bare_rank_memory,
                                               rank_memory)
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import WORK_KINDS, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.validate import validate
from clustersim.sim.cost_model import UniformCostModel
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

MODEL = get_model("llama3-8b", num_layers=8)
K = MIXED_PRECISION_K
SCHEDULES = [("1f1b", None), ("interleaved-1f1b", 2), ("gpipe", None)]
SHARDINGS = [dict(zero_stage=2), dict(zero_stage=3), dict(zero_stage=3,
                                                           reshard_after_forward=False),
             dict(fsdp="hybrid", shard_size=2), dict(fsdp="hybrid", zero_stage=2,
                                                     shard_size=2)]


def _lowered(pp, schedule="1f1b", vpp=None, m=4, dp=4, **kw):
    parallel = ParallelConfig(pp=pp, vpp=vpp, dp=dp, num_microbatches=m, schedule=schedule,
                              **kw)
    plan = resolve(MODEL, parallel)
    return plan, add_data_parallel(plan.build_schedule(), plan)


# --- memory: the ZeRO paper's closed forms ----------------------------------------------
@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("dp", [4, 8])
def test_model_states_follow_the_zero_formulas_with_a_pipeline(pp, dp):
    psi_total = 8e9
    psi = psi_total / pp  # per pipeline rank (tp = 1)
    expected = {1: (2 + 2 + K / dp) * psi, 2: (2 + (2 + K) / dp) * psi,
                3: (2 + 2 + K) * psi / dp}
    for stage, total in expected.items():
        ranks = bare_rank_memory(psi_total, ParallelConfig(pp=pp, dp=dp, zero_stage=stage))
        assert len(ranks) == pp
        for r in ranks:
            assert r.model_states_bytes == pytest.approx(total, rel=1e-12)


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp_with_a_pipeline_holds_the_stage_unsharded_through_the_step(pp, reshard):
    """ZeRO-3 shards (2+2+K) Psi / N, plus the stage's unsharded 16-bit parameters and its
    unsharded accumulated gradients, 2 Psi each (torch pipelining keeps both to the
    step's end)."""
    parallel = ParallelConfig(pp=pp, dp=8, zero_stage=3, num_microbatches=2 * pp,
                              reshard_after_forward=reshard)
    for r in rank_memory(resolve(MODEL, parallel)):
        assert r.model_states_bytes == pytest.approx((2 + 2 + K) * r.params / 8, rel=1e-12)
        assert r.gathered_parameters == pytest.approx(2 * r.params, rel=1e-12)
        assert r.unsharded_gradients == pytest.approx(2 * r.params, rel=1e-12)
        assert r.total_bytes >= r.model_states_bytes + 4 * r.params


def test_zero2_with_a_pipeline_keeps_no_unsharded_gradients():
    parallel = ParallelConfig(pp=2, dp=8, zero_stage=2, num_microbatches=4)
    for r in rank_memory(resolve(MODEL, parallel)):
        assert r.model_states_bytes == pytest.approx((2 + (2 + K) / 8) * r.params, rel=1e-12)
        assert r.unsharded_gradients == 0 and r.gathered_parameters == 0


# --- every op once, the schedule completes ------------------------------------------------
@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("schedule, vpp", SCHEDULES)
@pytest.mark.parametrize("kw", SHARDINGS, ids=["zero2", "zero3", "zero3-keep", "hsdp",
                                              "hsdp-zero2"])
def test_every_op_runs_once_and_the_schedule_completes(pp, schedule, vpp, kw):
    plan, lowered = _lowered(pp, schedule, vpp, m=2 * pp, **kw)
    validate(lowered)  # structure, contract, unit-time dry run to the end
    for program in lowered.programs:  # one optimizer step per stage held
        steps = [op.stage for op in program if op.kind is OpKind.OPT_STEP]
        assert len(steps) == len(set(steps))
    work = [(op.kind, op.stage, op.microbatch, op.chunk) for op in lowered.ops()
            if op.kind in WORK_KINDS]
    assert len(work) == len(set(work))
    groups = plan.layer_groups
    cover: dict[tuple, set] = {}
    for kind, stage, microbatch, chunk in work:  # an op whole, or all its layer groups
        cover.setdefault((kind, stage, microbatch), set()).add(chunk)
    assert len(cover) == 2 * plan.num_stages * plan.parallel.num_microbatches
    assert all(c in ({None}, set(range(groups))) for c in cover.values())
    final = lower(lowered, plan)
    timeline = simulate(MODEL, plan.parallel, load_topology("dgx-h100-x16-ndr"), lowered,
                        UniformCostModel(1.0, 2.0))
    computed = [s for s in timeline.spans if s.lane == "compute"
                and s.op.kind in WORK_KINDS]
    assert len(computed) == sum(op.kind in WORK_KINDS for op in final.ops())


@pytest.mark.parametrize("kw", SHARDINGS[:4], ids=["zero2", "zero3", "zero3-keep", "hsdp"])
def test_the_roofline_replay_runs_to_the_end(kw):
    parallel = ParallelConfig(pp=2, dp=4, num_microbatches=4, **kw)
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100"))
    assert timeline.iteration_time > 0
    lanes = {s.lane for s in timeline.spans}
    assert lanes >= {"compute", "send", "recv"}


# --- the collectives of one step, per stage ----------------------------------------------
def _dp_ops(program, stage, kind):
    return [op for op in program if op.stage == stage and op.kind is kind]


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("m", [4, 8])
@pytest.mark.parametrize("schedule, vpp", SCHEDULES)
def test_fsdp2_with_a_pipeline_gathers_and_scatters_once_per_step(pp, m, schedule, vpp):
    """torchtitan's default with PP (reshard_after_forward off): per stage and step one
    all-gather of each FSDP unit before its first forward and one reduce-scatter of its
    gradients after the stage's last backward: in all, the stage's parameters once and its
    gradients once, whatever the microbatches."""
    plan, lowered = _lowered(pp, schedule, vpp, m=m, zero_stage=3,
                             reshard_after_forward=False)
    groups = plan.layer_groups
    for program in lowered.programs:
        for s in {op.stage for op in program if op.kind is OpKind.F}:
            costs = plan.group_costs[s]
            gathers = _dp_ops(program, s, OpKind.ALL_GATHER)
            scatters = _dp_ops(program, s, OpKind.REDUCE_SCATTER)
            assert len(gathers) == len(scatters) == groups
            assert sorted(op.chunk for op in gathers) == list(range(groups))
            assert sum(op.nbytes for op in gathers) == sum(
                (c.param_count + c.tied_param_count) * MODEL.dtype_bytes for c in costs)
            assert sum(op.nbytes for op in scatters) == sum(c.grad_bytes for c in costs)
            first_forward = min(i for i, op in enumerate(program)
                                if op.kind is OpKind.F and op.stage == s)
            last_backward = max(i for i, op in enumerate(program)
                                if op.kind in (OpKind.B, OpKind.W) and op.stage == s)
            assert all(program.index(op) <= first_forward + groups for op in gathers)
            assert all(program.index(op) > last_backward for op in scatters)


def test_fsdp2_resharding_after_forward_regathers_for_the_backward_only():
    """torchtitan's 'always' policy: each forward reshards its unit; the backward gathers
    it again and keeps it (torch pipelining: no reshard after backward), so the next
    forward needs no gather."""
    plan, lowered = _lowered(2, m=4, zero_stage=3)
    program = lowered.programs[0]
    groups = plan.layer_groups
    gathers = _dp_ops(program, 0, OpKind.ALL_GATHER)
    # rank 0 runs F0 F1 B0 F2 B1 F3 B2 B3: F0, F1 gather (F0 resharded), B0, B1, B2 gather
    # after a resharding forward, F2, F3 find B's parameters kept and B3 B2's
    assert len(gathers) == groups * 5
    assert len(_dp_ops(program, 0, OpKind.REDUCE_SCATTER)) == groups


@pytest.mark.parametrize("m", [3, 6])
def test_hsdp_with_a_pipeline_reduces_the_shard_over_replicas_once(m):
    plan, lowered = _lowered(2, m=m, fsdp="hybrid", shard_size=2, reshard_after_forward=False)
    program = lowered.programs[0]
    groups, costs = plan.layer_groups, plan.group_costs[0]
    scatters = _dp_ops(program, 0, OpKind.REDUCE_SCATTER)
    reduces = _dp_ops(program, 0, OpKind.ALL_REDUCE)
    assert {op.group for op in scatters} == {"dp_shard"}
    assert {op.group for op in reduces} == {"dp_replicate"}
    assert len(scatters) == len(reduces) == groups
    assert sum(op.nbytes for op in reduces) == sum(c.grad_bytes // 2 for c in costs)


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("m", [4, 8])
def test_zero2_with_a_pipeline_reduce_scatters_every_microbatch(pp, m):
    """Megatron-FSDP optim_grads: each microbatch's backward reduce-scatters the stage's
    gradients (M times per step), no gather before compute, and the updated parameters
    are gathered once after the step."""
    plan, lowered = _lowered(pp, m=m, zero_stage=2)
    program = lowered.programs[0]
    grad_bytes = plan.stage_costs[0].grad_bytes
    scatters = _dp_ops(program, 0, OpKind.REDUCE_SCATTER)
    assert sum(op.nbytes for op in scatters) == m * grad_bytes
    assert {op.microbatch for op in scatters} == set(range(m))
    gathers = _dp_ops(program, 0, OpKind.ALL_GATHER)
    step = next(i for i, op in enumerate(program) if op.kind is OpKind.OPT_STEP)
    assert gathers and all(program.index(op) > step for op in gathers)
    params = plan.stage_costs[0].param_count + plan.stage_costs[0].tied_param_count
    assert sum(op.nbytes for op in gathers) == params * MODEL.dtype_bytes


def test_zero2_hsdp_with_a_pipeline_reduces_over_replicas_after_the_last_microbatch():
    m = 4
    plan, lowered = _lowered(2, m=m, fsdp="hybrid", zero_stage=2, shard_size=2)
    program = lowered.programs[0]
    reduces = _dp_ops(program, 0, OpKind.ALL_REDUCE)
    assert reduces and {op.microbatch for op in reduces} == {m - 1}
    assert {op.group for op in reduces} == {"dp_replicate"}
    assert sum(op.nbytes for op in reduces) == plan.stage_costs[0].grad_bytes // 2


# --- refused, one line each --------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    (dict(zero_stage=3, hpz=True), r"hpz \(ZeRO\+\+\) .*pp=2.*PipelineEngine"),
    (dict(zero_stage=3, quantized_gradients=True), r"quantized_gradients \(ZeRO\+\+\)"),
    (dict(zero_stage=3, offload=True), r"offload with zero_stage=3 and pp=2"),
    (dict(zero_stage=2, overlap_grad_reduce=False), r"Megatron-FSDP's optim_grads"),
])
def test_unsupported_combinations_are_refused_with_the_rule(kw, match):
    with pytest.raises(ConfigError, match=match) as err:
        ParallelConfig(pp=2, dp=4, **kw)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kw", [dict(zero_stage=2), dict(zero_stage=3), dict(fsdp="full"),
                                dict(fsdp="hybrid", shard_size=2)])
def test_the_framework_combinations_are_accepted(kw):
    assert ParallelConfig(pp=2, dp=4, **kw).zero_stage in (2, 3)


def test_a_one_layer_stage_is_one_fsdp_unit():
    plan, lowered = _lowered(8, m=8, zero_stage=3, reshard_after_forward=False, dp=2)
    assert plan.layer_groups == 1
    program = lowered.programs[0]
    assert len(_dp_ops(program, 0, OpKind.ALL_GATHER)) == 1
    assert len(_dp_ops(program, 0, OpKind.REDUCE_SCATTER)) == 1
    assert math.isclose(sum(op.nbytes for op in _dp_ops(program, 0, OpKind.REDUCE_SCATTER)),
                        plan.stage_costs[0].grad_bytes)
