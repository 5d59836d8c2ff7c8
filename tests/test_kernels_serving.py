"""kernels.serving_steps against a single-process reference: the training layer's full
causal forward (kernels.layers.TransformerLayer) over the whole sequence. A prefill
through the KV cache equals it; each decode step with the cache equals its row for that
token; a batch of sequences with different contexts decodes as each alone; greedy
sampling equals the argmax of logits computed with plain torch ops. Real torch, fp32.
And `calibrate --serving` then `serve --profile`, as a user runs them."""
import json

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")
import torch.nn.functional as F  # noqa: E402

from clustersim.kernels.calibrate import serving_points  # noqa: E402
from clustersim.kernels.layers import TransformerLayer, init_parameters  # noqa: E402
from clustersim.kernels.microbench import stage_parts  # noqa: E402
from clustersim.kernels.serving_steps import (KVCache, decode, measure_serving,  # noqa: E402
                                              prefill, sample)
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.profile import Profile  # noqa: E402
from test_cli import clustersim  # noqa: E402

LLAMA = ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                  seq_length=32, vocab_size=128, dtype="fp32", swiglu=True,
                  normalization="RMSNorm", add_bias_linear=False,
                  position_embedding_type="rope", untie_embeddings_and_output_weights=True)
GPT = ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=32,
                vocab_size=128, dtype="fp32")
CPU = torch.device("cpu")


def layer_of(spec: ModelSpec, seed: int = 3) -> TransformerLayer:
    layer = TransformerLayer(spec)
    init_parameters(layer, seed)
    return layer


def tokens(b: int, s: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, s, 64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("spec", [LLAMA, GPT], ids=["llama-gqa-rope", "gpt"])
@torch.no_grad()
def test_prefill_equals_the_full_forward(spec):
    layer, x = layer_of(spec), tokens(2, 12)
    cache = KVCache(spec, 2, 32, CPU)
    torch.testing.assert_close(prefill(layer, x, cache), layer(x))
    assert cache.lengths == [12, 12]
    assert cache.k[:, :, 12:].abs().sum() == 0  # nothing beyond the prompt


@pytest.mark.parametrize("spec", [LLAMA, GPT], ids=["llama-gqa-rope", "gpt"])
@torch.no_grad()
def test_decode_steps_equal_the_full_forwards_rows(spec):
    layer, x = layer_of(spec), tokens(1, 10)
    full = layer(x)
    cache = KVCache(spec, 1, 16, CPU)
    prefill(layer, x[:, :6], cache)
    for t in range(6, 10):  # one token at a time after a 6-token prompt
        torch.testing.assert_close(decode(layer, x[:, t:t + 1], cache), full[:, t:t + 1])
        assert cache.lengths == [t + 1]


@torch.no_grad()
def test_a_batch_of_different_contexts_decodes_as_each_alone():
    layer = layer_of(LLAMA)
    prompts = [tokens(1, n, seed=n) for n in (3, 9, 5)]
    nexts = [tokens(1, 1, seed=100 + n) for n in (3, 9, 5)]
    cache = KVCache(LLAMA, 3, 16, CPU)
    for i, p in enumerate(prompts):  # each sequence's own prompt into its row
        alone = KVCache(LLAMA, 1, 16, CPU)
        prefill(layer, p, alone)
        cache.k[i], cache.v[i] = alone.k[0], alone.v[0]
        cache.set_length(i, 1, alone.lengths[0])
    out = decode(layer, torch.cat(nexts), cache)
    for i, (p, n) in enumerate(zip(prompts, nexts)):
        reference = layer(torch.cat([p, n], dim=1))[:, -1:]
        torch.testing.assert_close(out[i:i + 1], reference)
    assert cache.lengths == [4, 10, 6] == cache.positions.tolist()


@torch.no_grad()
def test_sample_is_the_argmax_of_the_logits():
    head = stage_parts(LLAMA, 5, CPU)["head"]
    x = tokens(4, 1)[:, 0]
    w = head.output_layer.weight
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * head.final_norm.weight
    assert torch.equal(sample(head, x), (normed @ w.T).argmax(-1))
    assert torch.equal(sample(head, x), F.linear(head.final_norm(x), w).argmax(-1))


def test_measure_serving_returns_every_point():
    out = measure_serving(LLAMA, CPU, (4, 16), ((1, 8), (3, 20)), (1, 5), warmup=1,
                          repeats=2)
    assert set(out["prefill"]) == {4, 16} and set(out["decode"]) == {(1, 8), (3, 20)}
    assert set(out["head"]) == {1, 5}
    for kind in out.values():
        for samples in kind.values():
            assert len(samples) == 2 and all(0 < s < 10 for s in samples)


@pytest.mark.parametrize("kwargs, words", [
    (dict(prefill_tokens=(0,)), "prefill_tokens"),
    (dict(decode_points=((2, 0),)), "decode_points"),
    (dict(head_rows=(1.5,)), "head_rows"),
    (dict(repeats=0), "repeats"),
])
def test_measure_serving_refuses_bad_points(kwargs, words):
    args = {**dict(prefill_tokens=(4,), decode_points=((1, 4),), head_rows=(1,), warmup=0,
                   repeats=1), **kwargs}
    with pytest.raises(ValueError, match=words):
        measure_serving(LLAMA, CPU, **args)


def test_moe_is_refused():
    moe = ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=32,
                    vocab_size=128, dtype="fp32", num_experts=4, moe_router_topk=2)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        measure_serving(moe, CPU, (4,), ((1, 4),), (1,), warmup=0, repeats=1)


SERVED = ("--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "256",
          "--num-attention-heads", "4", "--vocab-size", "128", "--seq-length", "64")


def test_cli_calibrate_serving_then_serve_with_the_profile(tmp_path):
    """The profile gets every serving point (serving_points: prompts of s/8, s/2, s; 1, 8
    and 32 sequences at s/2 and s cached; 1 and 32 rows), calibrate prints the fit and each
    point against it, and serve prices its steps at the fitted rates."""
    cal = clustersim("calibrate", "--serving", *SERVED, "--dtype", "bf16", "--repeats", "3",
                     "--warmup", "1", "-o", "p.json", cwd=tmp_path)
    serving = Profile.load(tmp_path / "p.json").serving
    assert [t for t, _ in serving.prefill] == [8, 32, 64]
    assert [(b, c) for b, c, _ in serving.decode] == [(b, c) for b in (1, 8, 32)
                                                     for c in (32, 64)]
    assert [r for r, _ in serving.head] == [1, 32] and serving.dtype == "bf16"
    assert serving_points(ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4,
                                    seq_length=64, vocab_size=128))[0] == (8, 32, 64)
    assert "serving steps, fitted" in cal.stdout and "decode batch 32 context 64" in cal.stdout
    out = clustersim("serve", *SERVED, "--profile", "p.json", "--num-prompts", "8",
                     "--input-len", "32", "--output-len", "4", "--json", "m.json",
                     cwd=tmp_path)
    assert "compute from the profile's serving steps (cpu)" in out.stdout
    assert json.loads((tmp_path / "m.json").read_text())["completed"] == 8
    bad = clustersim("calibrate", "--serving", *SERVED, "--dtype", "fp32", cwd=tmp_path,
                     check=False)
    assert bad.returncode == 2 and "--dtype fp32 is not served" in bad.stderr
