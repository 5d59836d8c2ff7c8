"""sim.memory: the replay's static bytes per ZeRO stage and the OOM report."""
import pytest

from clustersim.schedules.lowering import lower
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.timeline import MemorySample, Span, Timeline
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.memory import memory_model, oom_report
from clustersim.topologies import load_topology

GPT = ModelSpec(num_layers=8, hidden_size=256, num_attention_heads=8, seq_length=128,
                vocab_size=1000)


def test_unsharded_static_is_16_bytes_per_param():
    """ZeRO stage 0 without data parallelism (no buckets, nothing gathered): (2+2+12) B
    per parameter held (a tied embedding twice). The no-model fallback is gone."""
    p = ParallelConfig(pp=2)
    plan = resolve(GPT, p)
    costs = plan.stage_costs
    breakdown = rank_memory(plan, in_flight=[0] * plan.num_stages)
    mm = memory_model(lower(build_schedule("1f1b", 2, 2), plan), plan, breakdown)
    assert list(mm.static) == [16 * (c.param_count + c.tied_param_count) for c in costs]
    assert list(mm.activations) == [c.activation_bytes for c in costs]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_static_follows_the_zero_stage(zero):
    p = ParallelConfig(dp=4, zero_stage=zero, num_microbatches=2)
    plan = resolve(GPT, p)
    costs = plan.stage_costs
    psi = costs[0].param_count
    breakdown = rank_memory(plan, in_flight=[0] * plan.num_stages)
    # a schedule without parameter gathers: the memory model's gathered estimate is static
    mm = memory_model(build_schedule("1f1b", 1, 2), plan, breakdown)
    states = [16 * psi, 4 * psi + 12 * psi / 4, 2 * psi + 14 * psi / 4, 16 * psi / 4][zero]
    rank = rank_memory(plan)[0]
    buffers = rank.communication_buffers + rank.gathered_parameters
    assert mm.static[0] == pytest.approx(states + buffers, abs=1)
    # the replay tracks gathered parameters op by op when the lowered schedule gathers
    # them (ZeRO 1-3 all-gather parameters over dp; ZeRO-0 does not): not static
    dynamic = memory_model(lower(build_schedule("1f1b", 1, 2), plan), plan, breakdown)
    assert dynamic.static[0] == pytest.approx(states + rank.communication_buffers, abs=1)
    assert (dynamic.gathered is not None) == (zero >= 1)


def test_gpus_per_node_of_a_preset():
    assert cluster_facts(load_topology("dgx-h100")).gpus_per_node == 8


def test_oom_report_names_rank_time_and_breakdown():
    p = ParallelConfig(pp=2, num_microbatches=2)
    ranks = rank_memory(resolve(GPT, p), in_flight=[0, 0])
    static = [r.model_states_bytes for r in ranks]
    capacity = max(static) + 500
    held = capacity + 500 - static[1]  # rank 1's activations at its peak
    f = Span(1, "compute", Op(OpKind.F, 1, 0), 0.0, 1.0)
    timeline = Timeline([f], [MemorySample(0, 0.0, static[0]), MemorySample(1, 0.0, static[1]),
                              MemorySample(1, 0.5, static[1] + held)])
    (entry,) = oom_report(timeline, ranks, capacity)
    assert entry["rank"] == 1 and entry["time_s"] == 0.5
    assert entry["activations_bytes"] == pytest.approx(held)
    assert entry["over_bytes"] == pytest.approx(500)
    assert entry["optimizer_states_bytes"] == ranks[1].optimizer_states
    assert oom_report(timeline, ranks, capacity=1e18) == []
