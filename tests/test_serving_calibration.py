"""Serving's rates fitted to measured steps (sim.serving.calibration): on steps generated
from known rates with the layer's FLOPs and bytes typed here (Megatron's 2 x tokens x
parameters for the GEMMs, 4 x head_dim x heads x causal pairs for attention, the weights
plus the KV cache read by a decode), the fit recovers the rates, and a simulated step is
priced with them; a profile that does not apply is refused."""
from dataclasses import asdict

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.profile import AlphaBeta, Profile, ServingTimes
from clustersim.sim.serving import simulate_serving, synthetic
from clustersim.sim.serving.calibration import fit_serving

L7 = get_model("llama2-7b")
H, A, D, F_FFN, V = 4096, 32, 128, 11008, 32000
LAYER = 4 * H * H + 3 * H * F_FFN + 2 * H  # QKVO, SwiGLU MLP, two RMSNorms
KV_TOKEN = 2 * 32 * D * 2  # K and V of one token in one layer, bf16
RATES = (3.0e11, 5.0e10, 2.0e-4)  # FLOP/s, bytes/s, s per layer per step: "measured"


def layer_seconds(prefill: int = 0, batch: int = 0, context: int = 0,
                  rates=RATES) -> float:
    flops_per_s, bytes_per_s, overhead = rates
    if prefill:
        tokens, pairs, kv = prefill, prefill * (prefill + 1) / 2, prefill * KV_TOKEN
    else:
        tokens, pairs, kv = batch, batch * (context + 1), batch * (context + 1) * KV_TOKEN
    gemm = max(2 * tokens * LAYER / flops_per_s, LAYER * 2 / bytes_per_s)
    attention = max(4 * D * A * pairs / flops_per_s, kv / bytes_per_s)
    return overhead + gemm + attention


def head_seconds(rows: int, rates=RATES) -> float:
    return rates[2] + max(2 * rows * V * H / rates[0], V * H * 2 / rates[1])


def profile(model=L7, dtype="bf16", serving=True) -> Profile:
    times = ServingTimes(
        dtype, [[t, layer_seconds(prefill=t)] for t in (256, 1024, 4096)],
        [[b, c, layer_seconds(batch=b, context=c)] for b in (1, 16, 64) for c in (512, 2048)],
        [[r, head_seconds(r)] for r in (1, 64)])
    return Profile("cuda:test", {p: {k: 1e-3 for k in "FBIW"}
                                 for p in ("layer", "embedding", "head")},
                   AlphaBeta(0.0, 0.0), model=asdict(model),
                   serving=times if serving else None)


def test_layer_size_is_the_published_one():
    assert LAYER == L7.layer_param_count()


def test_fit_recovers_the_rates_that_made_the_steps():
    rates = fit_serving(profile(), L7, "bf16")
    # a CPU-like device: its large-batch decodes are compute-bound, its small memory-bound
    assert layer_seconds(batch=64, context=512) > layer_seconds(batch=1, context=512) * 5
    for fitted, made in zip((rates.flops_per_s, rates.bytes_per_s, rates.overhead), RATES):
        assert fitted == pytest.approx(made, rel=1e-5)  # the grid's last step: 1e-6 decades
    assert rates.worst_error() < 1e-5
    assert len(rates.residuals) == 3 + 6 + 2


def test_profile_round_trips_through_json():
    p = profile()
    assert Profile.from_json(p.to_json()).serving == p.serving


def test_a_served_decode_step_is_priced_at_the_fitted_rates():
    """One sequence decoding after c cached tokens on one GPU: 32 layers at the fitted
    overhead and bandwidth (weights and KV cache read), plus the output layer's row."""
    r = simulate_serving(L7, "dgx-h100", synthetic(1, 100, 2), profile=profile())
    fitted = fit_serving(profile(), L7, "bf16")
    rates = (fitted.flops_per_s, fitted.bytes_per_s, fitted.overhead)
    times = r.run.served[0].token_times
    assert times[1] - times[0] == pytest.approx(
        32 * layer_seconds(batch=1, context=100, rates=rates) + head_seconds(1, rates),
        rel=1e-9)
    assert any("fitted" in note and "cuda:test" in note for note in r.notes)


@pytest.mark.parametrize("kwargs, words", [
    (dict(profile=profile(serving=False)), "no serving section"),
    (dict(profile=profile(model=get_model("llama2-13b"))), "hidden_size: the profile"),
    (dict(profile=profile(dtype="fp16")), "serving.dtype is fp16"),
    (dict(profile=profile(), compute_efficiency=0.5), "compute_efficiency would change"),
    (dict(profile=profile(), quantization="fp8"), "quantization would change nothing"),
])
def test_a_profile_that_does_not_apply_is_refused(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        simulate_serving(L7, "dgx-h100", synthetic(1, 100, 2), **kwargs)


def test_serving_times_refuse_bad_rows():
    with pytest.raises(ConfigError, match="serving.decode"):
        ServingTimes("bf16", [[8, 1e-3]], [[4, 1e-3]], [[1, 1e-3]])
    with pytest.raises(ConfigError, match="serving.prefill"):
        ServingTimes("bf16", [[8, -1.0]], [[4, 8, 1e-3]], [[1, 1e-3]])
