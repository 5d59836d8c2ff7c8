"""Flash-attention times from a profile's attention section (sim.attention_table), against
closed forms: causal attention's model FLOPs are 4 b h s^2 d forward (QK^T and PV over the
full score matrix) and twice that backward, so a kernel of a measured shape takes exactly
the measured time, and between two measured head counts the rate is log-linear."""
import math

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import layer_backward, layer_forward
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.profile import AttentionTimes, Profile
from clustersim.sim.attention_table import AttentionTable, attention_seconds_of
from clustersim.sim.cost import RooflineCost
from clustersim.topologies import get_device

B, S, D = 2, 1024, 64
FORWARD = {16: 2e-4, 32: 3e-4}  # measured seconds at 16 and 32 heads
BACKWARD = {16: 5e-4, 32: 8e-4}


def table(dtype="bf16", causal=True) -> AttentionTimes:
    return AttentionTimes(dtype, causal, tuple((B, h, h // 4, S, D, FORWARD[h], BACKWARD[h])
                                               for h in (16, 32)))


def flash_kernels(heads: int, tp: int = 1):
    """The forward and backward flash kernels of a layer with `heads` heads of dim D."""
    model = ModelSpec(num_layers=1, hidden_size=heads * D, num_attention_heads=heads,
                      num_query_groups=heads // 4 if heads % 4 == 0 else heads,
                      seq_length=S, micro_batch_size=B, vocab_size=512, use_flash_attn=True)
    parallel = ParallelConfig(tp=tp)
    forward = next(k for k in layer_forward(model, parallel) if k.attention)
    backward = next(k for k in layer_backward(model, parallel) if k.attention)
    return forward, backward


def test_a_measured_shape_takes_its_measured_time_forward_and_backward():
    attention = AttentionTable(table())
    for heads in (16, 32):
        forward, backward = flash_kernels(heads)
        assert forward.flops == pytest.approx(4 * B * heads * S * S * D)
        assert backward.flops == pytest.approx(2 * forward.flops)
        assert attention.seconds(forward, "bf16") == pytest.approx(FORWARD[heads])
        assert attention.seconds(backward, "bf16") == pytest.approx(BACKWARD[heads])


def test_tensor_parallel_shards_are_priced_at_their_heads_per_rank():
    forward, _ = flash_kernels(32, tp=2)  # 16 heads per rank
    assert AttentionTable(table()).seconds(forward, "bf16") == pytest.approx(FORWARD[16])


def test_between_two_measured_head_counts_the_rate_is_log_linear_in_flops():
    forward, _ = flash_kernels(24)
    rate = {h: 4 * B * h * S * S * D / FORWARD[h] for h in (16, 32)}
    share = math.log(24 / 16) / math.log(32 / 16)
    expected = math.exp(math.log(rate[16]) + share * math.log(rate[32] / rate[16]))
    assert AttentionTable(table()).seconds(forward, "bf16") == pytest.approx(
        forward.flops / expected)


def test_no_answer_outside_the_measurements():
    attention = AttentionTable(table())
    more_heads, _ = flash_kernels(64)  # beyond the measured 32: not extrapolated
    assert attention.seconds(more_heads, "bf16") is None
    forward, _ = flash_kernels(16)
    assert attention.seconds(forward, "fp16") is None  # another dtype
    model = ModelSpec(num_layers=1, hidden_size=16 * D, num_attention_heads=16,
                      seq_length=S, micro_batch_size=B, vocab_size=512, use_flash_attn=True)
    cp = next(k for k in layer_forward(model, ParallelConfig(cp=2)) if k.attention)
    assert attention.seconds(cp, "bf16") is None  # s / cp was not measured


def test_a_non_causal_measurement_is_refused():
    with pytest.raises(ConfigError, match="attention.causal is false"):
        AttentionTable(table(causal=False))


def test_the_roofline_takes_the_measured_time_and_falls_back_to_the_curve():
    profile = Profile.from_dict({"device": "cpu", "compute": {
        p: {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0} for p in ("layer", "embedding", "head")},
        "p2p": {"alpha": 1e-5, "beta": 1e-9}, "attention": table().to_dict()})
    device = get_device("h100-sxm")
    measured = RooflineCost(device, attention_seconds=attention_seconds_of(profile))
    published = RooflineCost(device)
    inside, _ = flash_kernels(16)
    outside, _ = flash_kernels(64)
    assert measured.kernels_time([inside]) == pytest.approx(
        max(FORWARD[16], published.time(0.0, inside.nbytes)))
    assert measured.kernels_time([outside]) == published.kernels_time([outside])
    assert attention_seconds_of(None) is None


def test_a_stage_of_several_layers_and_half_a_backward_take_that_many_calls():
    """A stage's kernel sums its layers' calls (layer_kernels.merge) and an I or W takes
    half a backward (Kernel.scaled(0.5)): each call is priced at its own shape's speed."""
    from clustersim.schedules.layer_kernels import merge
    model = ModelSpec(num_layers=1, hidden_size=16 * D, num_attention_heads=16,
                      num_query_groups=4, seq_length=S, micro_batch_size=B, vocab_size=512,
                      use_flash_attn=True)
    parallel = ParallelConfig()
    three = next(k for k in merge(layer_forward(model, parallel) * 3) if k.attention)
    backward = next(k for k in layer_backward(model, parallel) if k.attention)
    attention = AttentionTable(table())
    assert attention.seconds(three, "bf16") == pytest.approx(3 * FORWARD[16])
    assert attention.seconds(backward.scaled(0.5), "bf16") == pytest.approx(BACKWARD[16] / 2)
