"""Per-kernel costs of a layer: FLOPs sum to SC21's formulas, bytes follow the shapes, an op
costs the sum of its kernels' rooflines. (That this predicts K22 Table 4's measured 22B
layer experiments: tests/test_fidelity.py.)"""
import dataclasses
from dataclasses import replace

import pytest

from clustersim.schedules import layer_kernels as lk
from clustersim.schedules.costs import costs_for_layers
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.plan import resolve
from clustersim.sim.cost import RooflineCost, StageKernelCost
from clustersim.topologies import get_device

GPT = ModelSpec(num_layers=8, hidden_size=256, num_attention_heads=8, seq_length=128,
                vocab_size=1024, micro_batch_size=2)
LLAMA = replace(get_model("llama3-8b"), num_layers=8)
MOE = get_model("mixtral-8x7b", num_layers=4)


def _flops(kernels):
    return sum(k.flops for k in kernels)


def _bytes(kernels, *names):
    return sum(k.nbytes for k in kernels if k.name in names)


@pytest.mark.parametrize("model", [GPT, LLAMA, MOE])
@pytest.mark.parametrize("tp,cp,sp", [(1, 1, False), (2, 1, False), (2, 1, True), (1, 2, False)])
def test_kernel_flops_sum_to_the_layer_formula(model, tp, cp, sp):
    par = ParallelConfig(tp=tp, cp=cp, sequence_parallel=sp)
    shard = tp * cp
    assert _flops(lk.layer_forward(model, par)) == pytest.approx(
        model.layer_forward_flops() / shard, rel=1e-12)
    assert _flops(lk.layer_backward(model, par)) == pytest.approx(
        model.layer_backward_flops() / shard, rel=1e-12)
    assert _flops(lk.head_forward(model, par)) == pytest.approx(
        model.logits_forward_flops() / shard, rel=1e-12)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_stage_kernels_carry_the_stage_flops(recompute):
    par = ParallelConfig(tp=2, recompute=recompute, micro_batch_size=2)
    for c in costs_for_layers(GPT, par, [2, 2, 2, 2]):  # 8 layers over 4 stages
        assert _flops(c.forward_kernels) == pytest.approx(c.forward_flops, rel=1e-12)
        assert _flops(c.backward_kernels) == pytest.approx(c.backward_flops, rel=1e-12)
        assert sum(k.nbytes for k in c.forward_kernels) == pytest.approx(c.forward_bytes, abs=1)
        assert len({k.name for k in c.forward_kernels}) == len(c.forward_kernels)  # merged


def test_sequence_parallel_divides_only_the_residual_stream_kernels():
    t = 4
    plain = lk.layer_forward(GPT, ParallelConfig(tp=t))
    sp = lk.layer_forward(GPT, ParallelConfig(tp=t, sequence_parallel=True))
    residual = ("norm", "bias_dropout_add")
    assert _bytes(sp, *residual) == pytest.approx(_bytes(plain, *residual) / t)
    others = {k.name for k in plain} - set(residual)
    assert _bytes(sp, *others) == pytest.approx(_bytes(plain, *others))


def test_moe_expert_weights_read_divide_by_etp_flops_do_not():
    """Mixtral (SwiGLU): fc1 reads 2*h*k*f_e/etp routed-expert weights, fc2 h*k*f_e/etp,
    in 16 bit; the layer's FLOPs are the same for every etp."""
    h, k, f_e = MOE.hidden_size, MOE.moe_router_topk, MOE.moe_ffn_hidden_size
    kw = dict(tp=4, dp=2, ep=2, sequence_parallel=True)
    one, four = (lk.layer_forward(MOE, ParallelConfig(expert_tensor_parallel=etp, **kw))
                 for etp in (1, 4))
    assert _bytes(one, "fc1_gemm") - _bytes(four, "fc1_gemm") == pytest.approx(
        2 * 2 * h * k * f_e * (1 - 1 / 4))
    assert _bytes(one, "fc2_gemm") - _bytes(four, "fc2_gemm") == pytest.approx(
        2 * h * k * f_e * (1 - 1 / 4))
    assert _flops(one) == _flops(four) == pytest.approx(MOE.layer_forward_flops() / 4)
    assert four == lk.layer_forward(MOE, ParallelConfig(**kw))  # etp unset = tp


def test_attention_bytes_grow_with_s_squared_unless_flash():
    """Doubling s doubles every O(sbh) tensor and quadruples the b*a*s^2 scores that
    softmax and dropout stream; flash attention never writes the scores."""
    core = ("softmax", "attention_dropout")
    one, two = (lk.layer_forward(replace(GPT, seq_length=s), ParallelConfig()) for s in (128, 256))
    assert _bytes(two, *core) == pytest.approx(4 * _bytes(one, *core))
    assert _bytes(two, "norm") == pytest.approx(2 * _bytes(one, "norm"))
    flash = [lk.attention_core_forward(replace(GPT, seq_length=s, use_flash_attn=True),
                                       ParallelConfig()) for s in (128, 256)]
    assert [k.name for k in flash[0]] == ["flash_attention"]
    assert flash[1][0].nbytes == pytest.approx(2 * flash[0][0].nbytes)
    assert flash[1][0].flops == pytest.approx(4 * flash[0][0].flops)


def test_softmax_streams_the_scores_of_its_heads():
    """b * (a/t) * s^2 scores, read and written once in 16 bit (2 x 2 bytes each)."""
    par = ParallelConfig(tp=2)
    softmax = next(k for k in lk.layer_forward(GPT, par) if k.name == "softmax")
    assert softmax.nbytes == 2 * 2 * GPT.micro_batch_size * (8 / 2) * 128 ** 2


def test_op_time_is_the_sum_of_kernel_rooflines_and_at_least_the_op_roofline():
    par = ParallelConfig(num_microbatches=1, micro_batch_size=2)
    plan = resolve(GPT, par)
    costs = plan.stage_costs
    roofline = RooflineCost(get_device("a100-80gb-sxm"), compute_efficiency=0.7,
                            memory_efficiency=0.8)
    cost = StageKernelCost([roofline], plan)
    forward = Op(OpKind.F, 0, 0).with_costs(flops=costs[0].forward_flops,
                                            nbytes=costs[0].forward_bytes)
    expected = sum(max(k.flops / (312e12 * 0.7), k.nbytes / (2.039e12 * 0.8))
                   for k in costs[0].forward_kernels)
    assert cost(forward) == pytest.approx(expected, rel=1e-12)
    assert cost(forward) >= roofline(forward) * (1 - 1e-12)  # sum of max >= max of sums
    w = Op(OpKind.W, 0, 0)
    assert cost(w) == pytest.approx(roofline.kernels_time(costs[0].backward_kernels) / 2)


@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 1), (1, 2)])
def test_causal_flash_attention_executes_flash_attentions_own_flop_count(tp, cp):
    """flash-attention's benchmark (benchmarks/benchmark_flash_attention.py) counts
    4*b*s^2*heads*head_dim // 2 for a causal forward and 2.5x that for its backward; the
    model FLOPs (what MFU counts) stay SC21's full 4bs^2h and 2x for the backward."""
    model = replace(LLAMA, micro_batch_size=2, seq_length=4096)
    par = ParallelConfig(tp=tp, cp=cp)
    b, s, a = 2, 4096, model.num_attention_heads
    d = model.hidden_size // a
    causal_forward = 4 * b * s ** 2 * a * d // 2 / (tp * cp)
    (fwd,) = [k for k in lk.layer_forward(replace(model, use_flash_attn=True), par)
              if k.name == "flash_attention"]
    (bwd,) = [k for k in lk.layer_backward(replace(model, use_flash_attn=True), par)
              if k.name == "flash_attention"]
    assert fwd.executed == pytest.approx(causal_forward, rel=1e-12)
    assert bwd.executed == pytest.approx(2.5 * causal_forward, rel=1e-12)
    assert (fwd.flops, bwd.flops) == pytest.approx((2 * causal_forward, 4 * causal_forward))
    # Megatron's unfused path computes every score: its work is its FLOPs
    unfused = lk.layer_forward(replace(model, use_flash_attn=False), par)
    assert all(k.executed == k.flops for k in unfused)


def test_an_op_is_charged_the_work_its_kernels_execute():
    model = replace(GPT, use_flash_attn=True)
    plan = resolve(model, ParallelConfig(num_microbatches=1, micro_batch_size=2))
    roofline = RooflineCost(get_device("a100-80gb-sxm"), compute_efficiency=0.7,
                            memory_efficiency=0.8)
    kernels = plan.stage_costs[0].backward_kernels
    expected = sum(max(k.executed / (312e12 * 0.7), k.nbytes / (2.039e12 * 0.8))
                   for k in kernels)
    assert roofline.kernels_time(kernels) == pytest.approx(expected, rel=1e-12)
    flash = next(k for k in kernels if k.name == "flash_attention")
    assert flash.executed == pytest.approx(flash.flops * 2.5 / 4)  # 2.5 x half vs 2 x full


def test_rotary_embedding_reads_and_writes_q_and_k_only_under_rope():
    par = ParallelConfig(tp=2)
    rope = next(k for k in lk.layer_forward(LLAMA, par) if k.name == "rope")
    q = LLAMA.micro_batch_size * LLAMA.seq_length * LLAMA.hidden_size / 2
    kv = LLAMA.micro_batch_size * LLAMA.seq_length * LLAMA.kv_hidden_size / 2
    assert rope.flops == 0 and rope.nbytes == 2 * 2 * (q + kv)
    assert "rope" not in {k.name for k in lk.layer_forward(GPT, par)}


@pytest.mark.parametrize("model", [GPT, LLAMA, MOE])
def test_every_gemm_carries_a_shape_whose_2mnk_is_its_flops(model):
    """An (M x K) @ (K x N) GEMM is 2MNK FLOPs; the backward's input gradient is (M x N)
    @ (N x K) and its weight gradient (K x M) @ (M x N): the same 2MNK each."""
    par = ParallelConfig(tp=2, sequence_parallel=True)
    forward = lk.layer_forward(model, par) + lk.head_forward(model, par)
    backward = lk.layer_backward(model, par) + lk.head_backward(model, par)
    gemms = [k for k in forward + backward if k.gemm]
    assert {k.name for k in gemms} >= {"qkv_gemm", "proj_gemm", "fc1_gemm", "fc2_gemm",
                                      "logits_gemm"}
    for k in gemms:
        m, n, kk = k.gemm
        assert k.flops == pytest.approx(2 * m * n * kk, rel=1e-12), k
    for f in (k for k in forward if k.gemm):
        m, n, kk = f.gemm
        grads = sorted(b.gemm for b in backward if b.name == f.name)
        assert grads == sorted([(m, kk, n), (kk, n, m)]), f.name
    tokens = model.micro_batch_size * model.seq_length
    qkv = next(k for k in forward if k.name == "qkv_gemm")
    assert qkv.gemm == (tokens, (model.hidden_size + 2 * model.kv_hidden_size) / 2,
                        model.hidden_size)


def test_measured_gemm_seconds_replace_the_gemms_compute_roofline_only():
    kernels = lk.layer_forward(GPT, ParallelConfig())
    device = get_device("a100-80gb-sxm")
    plain = RooflineCost(device, compute_efficiency=0.7, memory_efficiency=0.8)
    measured = {"fc1_gemm": 1e-3}
    table = RooflineCost(device, compute_efficiency=0.7, memory_efficiency=0.8,
                         gemm_seconds=lambda k, dtype: measured.get(k.name))
    fc1 = [k for k in kernels if k.name == "fc1_gemm"]
    rest = [k for k in kernels if k.name != "fc1_gemm"]
    assert table.kernels_time(fc1) == pytest.approx(max(1e-3, plain.time(0.0, fc1[0].nbytes)))
    assert table.kernels_time(rest) == pytest.approx(plain.kernels_time(rest), rel=1e-12)


def test_scaled_scales_the_work_and_keeps_every_other_field():
    """Kernel.scaled builds its copy field by field (not dataclasses.replace): every
    field is either scaled or kept, so a field added to Kernel must be added there too."""
    gemm = lk.Kernel("fc1", 10.0, 4.0, work=12.0, gemm=(8.0, 16.0, 32.0))
    flash = lk.Kernel("flash", 6.0, 2.0, attention=(4096.0, "forward", 3.0))
    for kernel in (gemm, flash):
        scaled = kernel.scaled(2.5)
        expected = replace(
            kernel, flops=kernel.flops * 2.5, nbytes=kernel.nbytes * 2.5,
            work=None if kernel.work is None else kernel.work * 2.5)
        assert scaled == expected
    assert [f.name for f in dataclasses.fields(lk.Kernel)] == [
        "name", "flops", "nbytes", "work", "gemm", "attention"]
