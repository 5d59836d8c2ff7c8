"""Eager elementwise ops (ModelSpec.fused_elementwise False): torchtitan's Llama op by op
(pytorch/torchtitan@9dec370, norms.py RMSNorm, llama/model.py): each op's bytes against
a hand count for a tiny model, GEMMs and flash unchanged, and eager slower than fused."""
from collections import defaultdict
from dataclasses import replace

import pytest

from clustersim.schedules import layer_kernels as lk
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import ParallelConfig
from clustersim.sim.cli import build_parser
from clustersim.sim.cli.flags import model_from_args
from clustersim.sim.cost import RooflineCost
from clustersim.topologies import get_device

FUSED = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                  seq_length=16, vocab_size=256, micro_batch_size=2, ffn_hidden_size=128,
                  swiglu=True, add_bias_linear=False, normalization="RMSNorm",
                  position_embedding_type="rope", use_flash_attn=True)
EAGER = replace(FUSED, fused_elementwise=False)
PAR = ParallelConfig()
T = 2 * 16  # tokens
R, Q, KV, F = T * 64, T * 64, T * 32, T * 128  # residual, Q, K (= V), MLP elements
# bf16 (2 bytes) and fp32 (4 bytes) reads + writes per element, by hand (eager_ops' rules)
NORM_FORWARD = {"rmsnorm_to_fp32": 2 + 4, "rmsnorm_pow": 4 + 4, "rmsnorm_mean": 4,
                "rmsnorm_mul_rsqrt": 4 + 4, "rmsnorm_type_as": 4 + 2,
                "rmsnorm_mul_weight": 2 + 2}
NORM_BACKWARD = {"rmsnorm_to_fp32": (4 + 4 + 4) + (4 + 2),  # sum two fp32 grads; cast
                 "rmsnorm_pow": (4 + 4) + (4 + 4) + (4 + 4 + 4),  # x.pow(1), 2*, grad*
                 "rmsnorm_mean": 4,  # grad / h expanded
                 "rmsnorm_mul_rsqrt": (4 + 4) + (4 + 4 + 4) + 4,  # grad*r; grad*x, row sum
                 "rmsnorm_type_as": 2 + 4,
                 "rmsnorm_mul_weight": (2 + 2) + (2 + 2 + 2) + 2}  # grad*w; grad*y, sum


def _by_name(kernels):
    total = defaultdict(float)
    for k in kernels:
        total[k.name] += k.nbytes
    return dict(total)


def test_layer_forward_bytes_per_op_match_hand_counts():
    want = {name: 2 * b * R for name, b in NORM_FORWARD.items()}  # two norms
    want.update({"rope_to_fp32": 6 * (Q + KV), "rope_complex_mul": 8 * (Q + KV),
                 "rope_type_as": 6 * (Q + KV),
                 "repeat_kv": 2 * 2 * (KV + Q),  # K and V: read h_kv, write h
                 "silu": 2 * 2 * F, "swiglu_mul": 3 * 2 * F, "residual_add": 2 * 3 * 2 * R})
    got = _by_name(lk.layer_forward(EAGER, PAR))
    assert {name: got[name] for name in want} == pytest.approx(want)
    assert not {"norm", "rope", "activation", "bias_dropout_add"} & set(got)


def test_layer_backward_bytes_per_op_match_hand_counts():
    want = {name: 2 * b * R for name, b in NORM_BACKWARD.items()}
    want.update({"rope_to_fp32": 6 * (Q + KV), "rope_complex_mul": 8 * (Q + KV),
                 "rope_type_as": 6 * (Q + KV), "repeat_kv": 2 * 2 * (KV + Q),
                 "silu": 3 * 2 * F,  # reads grad and input, writes grad
                 "swiglu_mul": 2 * 3 * 2 * F,  # grad * each saved factor
                 "residual_add": 2 * 3 * 2 * R})  # sums the branches' gradients
    got = _by_name(lk.layer_backward(EAGER, PAR))
    assert {name: got[name] for name in want} == pytest.approx(want)
    assert sum(NORM_FORWARD.values()) == 36 and sum(NORM_BACKWARD.values()) == 92


def test_gemms_and_flash_are_unchanged():
    for fn in (lk.layer_forward, lk.layer_backward):
        heavy = [[k for k in fn(m, PAR) if k.gemm or k.attention] for m in (FUSED, EAGER)]
        assert heavy[0] == heavy[1]
        assert sum(k.flops for k in fn(EAGER, PAR)) == sum(k.flops for k in fn(FUSED, PAR))


def test_head_norm_is_eager_and_fused_default_unchanged():
    eager, fused = lk.head_forward(EAGER, PAR), lk.head_forward(FUSED, PAR)
    assert _by_name(eager)["rmsnorm_pow"] == 8 * R and _by_name(fused)["norm"] == 4 * R
    assert _by_name(lk.head_backward(EAGER, PAR))["rmsnorm_pow"] == 28 * R
    assert _by_name(lk.head_backward(FUSED, PAR))["norm"] == 6 * R
    assert ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=8,
                     vocab_size=64).fused_elementwise


def test_layernorm_and_gelu_are_single_kernels_either_way():
    gpt = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16,
                    vocab_size=256, use_flash_attn=True)
    eager = _by_name(lk.layer_forward(replace(gpt, fused_elementwise=False), PAR))
    fused = _by_name(lk.layer_forward(gpt, PAR))
    assert eager["norm"] == fused["norm"] and eager["activation"] == fused["activation"]
    assert eager["residual_add"] == 2 * 3 * 2 * 16 * 64  # b=1: 16 tokens; no dropout mask


def test_eager_layer_is_slower():
    roofline = RooflineCost(get_device("h100-sxm"), compute_efficiency=0.7,
                            memory_efficiency=0.8)
    for fn in (lk.layer_forward, lk.layer_backward):
        assert roofline.kernels_time(fn(EAGER, PAR)) > roofline.kernels_time(fn(FUSED, PAR))


def test_flags_and_refusals():
    base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "16", "--vocab-size", "256"]
    for flag in ("--no-fused-elementwise", "--eager-elementwise"):
        args = build_parser().parse_args(["simulate", *base, flag])
        assert model_from_args(args).fused_elementwise is False
    assert model_from_args(build_parser().parse_args(["simulate", *base])).fused_elementwise
    with pytest.raises(ConfigError, match="fp8"):
        replace(FUSED, dtype="fp8", fused_elementwise=False)
    with pytest.raises(ConfigError, match="bool"):
        replace(FUSED, fused_elementwise=0)


def test_a_measured_profile_refuses_the_eager_kernel_list():
    """The setting picks the roofline's kernels; a profile's times were measured as they
    ran, so the flag would change nothing there: refused."""
    from test_profile import make_profile

    from clustersim.schedules.profile import model_shape
    from clustersim.sim.profile_cost import check_profile
    check_profile(make_profile(model=model_shape(FUSED)), FUSED)
    with pytest.raises(ConfigError, match="--no-fused-elementwise"):
        check_profile(make_profile(model=model_shape(EAGER)), EAGER)


def test_fixed_seconds_and_real_kernels_refuse_the_eager_kernel_list():
    """Uniform costs and the kernels backend do not price the kernel list either: the
    setting would change nothing there, so it is refused."""
    from clustersim.kernels import run_schedule
    from clustersim.schedules.plan import resolve
    from clustersim.schedules.registry import build_schedule
    from clustersim.sim.cost_model import UniformCostModel
    from clustersim.sim.simulate import simulate
    from clustersim.topologies import load_topology
    layout = ParallelConfig(num_microbatches=1, micro_batch_size=EAGER.micro_batch_size)
    plan = resolve(EAGER, layout)
    with pytest.raises(ConfigError, match="--uniform-costs' fixed seconds would ignore it"):
        simulate(EAGER, layout, load_topology("dgx-h100"), costs=UniformCostModel(1.0, 2.0))
    with pytest.raises(ConfigError, match="the kernels backend, which runs PyTorch's own"):
        run_schedule(build_schedule("1f1b", 1, 1), plan)
