"""Plan.stage_costs: per-stage sums equal the whole model; boundary and recompute formulas."""
from dataclasses import replace

import pytest

from clustersim.schedules.costs import output_activation_bytes
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve

GPT = ModelSpec(num_layers=8, hidden_size=256, num_attention_heads=8, seq_length=128,
                vocab_size=1000, micro_batch_size=2)
LLAMA = replace(get_model("llama3-8b"), num_layers=8)


def plan_costs(model, parallel, num_stages):
    """The stage costs of the plan of `parallel` split into `num_stages` pipeline stages."""
    return resolve(model, replace(parallel, pp=num_stages)).stage_costs


@pytest.mark.parametrize("model", [GPT, LLAMA])
@pytest.mark.parametrize("stages", [1, 2, 4, 8])
def test_stage_sums_equal_model(model, stages):
    par = ParallelConfig(micro_batch_size=model.micro_batch_size)
    costs = plan_costs(model, par, stages)
    assert len(costs) == stages and all(c.layers == 8 // stages for c in costs)
    assert sum(c.param_count for c in costs) == model.param_count()
    assert sum(c.forward_flops for c in costs) == model.forward_flops()
    assert sum(c.backward_flops for c in costs) == 2 * model.forward_flops()
    tied = stages > 1 and not model.untie_embeddings_and_output_weights
    assert costs[-1].tied_param_count == (model.vocab_size * model.hidden_size if tied else 0)


def test_iteration_flops_from_stages():
    par = ParallelConfig(micro_batch_size=2, recompute="full")
    costs = plan_costs(GPT, par, 4)
    per_mb = sum(c.forward_flops + c.backward_flops for c in costs)
    assert per_mb * 3 == GPT.iteration_flops(3, recompute=True)


def test_tp_cp_divide_flops():
    base = plan_costs(GPT, ParallelConfig(micro_batch_size=2), 2)
    split = plan_costs(GPT, ParallelConfig(tp=2, cp=2, micro_batch_size=2), 2)
    for b, s in zip(base, split):
        assert s.forward_flops == pytest.approx(b.forward_flops / 4)


def test_selective_recompute_adds_core_attention():
    costs = plan_costs(GPT, ParallelConfig(micro_batch_size=2, recompute="selective"), 2)
    assert costs[0].backward_flops == 2 * costs[0].forward_flops + 4 * GPT.attention_core_flops()


def test_boundary_bytes():
    b, s, h = 2, 128, 256
    costs = plan_costs(GPT, ParallelConfig(micro_batch_size=2), 4)
    assert [c.boundary_bytes for c in costs] == [b * s * h * 2] * 3 + [0]
    sp = plan_costs(GPT, ParallelConfig(tp=4, sequence_parallel=True, micro_batch_size=2), 4)
    assert sp[0].boundary_bytes == b * s * h * 2 // 4
    assert plan_costs(GPT, ParallelConfig(tp=4, micro_batch_size=2), 4)[0].boundary_bytes \
        == b * s * h * 2
    fp32 = replace(GPT, dtype="fp32")
    assert plan_costs(fp32, ParallelConfig(micro_batch_size=2), 2)[0].boundary_bytes == b * s * h * 4


def test_activation_bytes_per_stage():
    par = ParallelConfig(tp=2, sequence_parallel=True, micro_batch_size=2)
    costs = plan_costs(GPT, par, 4)
    layer = GPT.layer_activation_bytes(2, True, "none")
    sbh = 128 * 2 * 256
    assert costs[1].activation_bytes == pytest.approx(2 * layer, abs=1)
    assert costs[0].activation_bytes == pytest.approx(2 * layer + sbh / 2, abs=1)
    # Korthikanti et al. 2022 sec. 4.3: output layer 4sbh/t (1 + V/h)
    assert output_activation_bytes(GPT, par) == pytest.approx(4 * sbh / 2 * (1 + 1000 / 256))
    assert costs[3].activation_bytes == pytest.approx(2 * layer + 4 * sbh / 2 * (1 + 1000 / 256),
                                                      abs=1)


def test_full_recompute_shrinks_activations_and_adds_traffic():
    none = plan_costs(GPT, ParallelConfig(micro_batch_size=2), 2)[1]
    full = plan_costs(GPT, ParallelConfig(micro_batch_size=2, recompute="full"), 2)[1]
    assert full.activation_bytes < none.activation_bytes
    assert full.backward_flops == none.backward_flops + 4 * GPT.layer_forward_flops()
    assert full.forward_bytes == none.forward_bytes
    assert full.backward_bytes > full.forward_bytes


def test_traffic_counts_weights():
    c = plan_costs(GPT, ParallelConfig(micro_batch_size=2), 2)[1]
    assert c.forward_bytes >= (c.param_count + c.tied_param_count) * 2
    assert c.backward_bytes >= 2 * (c.param_count + c.tied_param_count) * 2


def test_tp_and_ep_shard_params():
    moe = replace(GPT, num_experts=4)
    one = plan_costs(moe, ParallelConfig(micro_batch_size=2), 2)
    sharded = plan_costs(moe, ParallelConfig(dp=4, ep=4, tp=2, micro_batch_size=2), 2)
    assert sharded[0].param_count < one[0].param_count / 2


def test_etp_shards_the_routed_experts_in_params_and_grad_bytes():
    """Per rank: E/ep experts of (2hf + f) sharded weights, each over etp ranks (plus its
    replicated fc2 bias h); FLOPs per rank do not change."""
    moe = replace(GPT, num_experts=4)
    h, f, layers = 256, 1024, 4
    sharded = 2 * h * f + f

    def stage(etp):
        return plan_costs(moe, ParallelConfig(dp=4, ep=2, tp=2, expert_tensor_parallel=etp,
                                               sequence_parallel=True, micro_batch_size=2), 2)[1]

    one, two = stage(1), stage(2)
    assert one.param_count - two.param_count == layers * 4 / 2 * sharded * (1 - 1 / 2)
    assert one.grad_bytes - two.grad_bytes == 2 * (one.param_count - two.param_count)
    assert (one.forward_flops, one.backward_flops) == (two.forward_flops, two.backward_flops)
    assert two == stage(None)  # etp unset = tp


def test_errors():
    with pytest.raises(ConfigError, match="num_layers=8 is not divisible by num_stages=3"):
        plan_costs(GPT, ParallelConfig(micro_batch_size=2), 3)
    with pytest.raises(ConfigError, match="micro_batch_size"):
        plan_costs(GPT, ParallelConfig(), 2)
    with pytest.raises(ConfigError, match="pp must be an integer >= 1"):  # the stage count
        plan_costs(GPT, ParallelConfig(micro_batch_size=2), 0)


def test_imbalanced_experts_take_longer_by_their_extra_gemm_work():
    """moe_imbalance f: the busiest expert gets f times the balanced tokens and every rank
    waits for it, so a forward takes (f-1) x the routed experts' GEMM FLOPs longer at the
    compute roofline: per MoE layer 2*b*s*h*k*f_e per matrix, 3 matrices with SwiGLU
    (Megatron's MoE MLP), on the H100's datasheet dense bf16 peak x 0.6, the efficiency
    given (issue 14, item 3:
    the time used to stay the same)."""
    from clustersim.schedules.ops import OpKind
    from clustersim.sim.cost_model import RooflineCostModel
    from clustersim.sim.simulate import simulate
    from clustersim.topologies import get_device, load_topology

    model = get_model("mixtral-8x7b", num_layers=4)
    topology = load_topology("dgx-h100")

    def forward_seconds(f: float) -> float:
        parallel = ParallelConfig(pp=1, dp=8, ep=8, zero_stage=1, num_microbatches=1,
                                  moe_imbalance=f)
        spans = simulate(model, parallel, topology,
                         costs=RooflineCostModel(compute_efficiency=0.6)).spans
        return next(s.duration for s in spans if s.rank == 0 and s.op.kind is OpKind.F)

    b, s, h = model.micro_batch_size, model.seq_length, model.hidden_size
    expert_gemm_flops = 4 * 2 * b * s * h * model.moe_router_topk * model.moe_ffn_hidden_size * 3
    peak = get_device("h100-sxm").peak("bf16") * 0.6
    for f in (2.0, 4.0):
        assert forward_seconds(f) - forward_seconds(1.0) == pytest.approx(
            (f - 1) * expert_gemm_flops / peak, rel=1e-9)
