"""kernels.serving_steps against a single-process reference: the training layer's full
causal forward (kernels.layers.TransformerLayer) over the whole sequence. A prefill
through the KV cache equals it; each decode step with the cache equals its row for that
token; a batch of sequences with different contexts decodes as each alone; the cache holds
the K and V the training layer computes; greedy sampling equals the argmax of logits
computed with plain torch ops. Real torch, fp32. And `calibrate --serving` then
`serve --profile`, as a user runs them."""
import json

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import serving_steps  # noqa: E402
from clustersim.kernels.calibrate import serving_points  # noqa: E402
from clustersim.kernels.layers import TransformerLayer, init_parameters, rotary  # noqa: E402
from clustersim.kernels.microbench import stage_parts  # noqa: E402
from clustersim.kernels.serving_steps import (KVCache, decode, measure_serving,  # noqa: E402
                                              prefill, sample)
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.profile import Profile  # noqa: E402
from test_cli import clustersim  # noqa: E402

# GQA (4 heads, 2 K/V groups), RoPE, SwiGLU, RMSNorm, no biases, untied output layer
LLAMA = ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                  seq_length=32, vocab_size=128, dtype="fp32", swiglu=True,
                  normalization="RMSNorm", add_bias_linear=False,
                  position_embedding_type="rope", untie_embeddings_and_output_weights=True)
# MHA, learned positions (none in the layer), GeLU, LayerNorm, biases, tied output layer
GPT = ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=32,
                vocab_size=128, dtype="fp32")
SPECS = pytest.mark.parametrize("spec", [LLAMA, GPT], ids=["llama-gqa-rope", "gpt"])
CPU = torch.device("cpu")


def layer_of(spec: ModelSpec, seed: int = 3) -> TransformerLayer:
    layer = TransformerLayer(spec)
    init_parameters(layer, seed)
    return layer


def tokens(b: int, s: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, s, 64, generator=torch.Generator().manual_seed(seed))


@SPECS
@torch.no_grad()
def test_prefill_equals_the_full_forward(spec):
    layer, x = layer_of(spec), tokens(2, 12)
    cache = KVCache(spec, 3, 32, CPU)
    torch.testing.assert_close(prefill(layer, x, cache), layer(x))
    assert cache.lengths == [12, 12, 0] == cache.positions.tolist()


@SPECS
@torch.no_grad()
def test_decode_steps_equal_the_full_forwards_rows(spec):
    layer, x = layer_of(spec), tokens(1, 10)
    full = layer(x)
    cache = KVCache(spec, 1, 16, CPU)
    torch.testing.assert_close(prefill(layer, x[:, :6], cache), full[:, :6])
    for t in range(6, 10):  # one token at a time after a 6-token prompt
        torch.testing.assert_close(decode(layer, x[:, t:t + 1], cache), full[:, t:t + 1])
        assert cache.lengths == [t + 1] == cache.positions.tolist()


@SPECS
@torch.no_grad()
def test_a_batch_of_different_contexts_decodes_as_each_alone(spec):
    layer = layer_of(spec)
    sizes = (3, 9, 1, 5)
    prompts = [tokens(1, n, seed=n) for n in sizes]
    cache = KVCache(spec, 4, 16, CPU)
    for i, p in enumerate(prompts):  # each sequence's own prompt into its row
        prefill(layer, p, cache, first=i)
    assert cache.lengths == list(sizes)
    for step in range(2):  # two decode steps of the batch, each row against its forward
        nexts = [tokens(1, 1, seed=100 * (step + 1) + n) for n in sizes]
        out = decode(layer, torch.cat(nexts), cache)
        prompts = [torch.cat([p, n], dim=1) for p, n in zip(prompts, nexts)]
        for i, p in enumerate(prompts):
            torch.testing.assert_close(out[i:i + 1], layer(p)[:, -1:])
        assert cache.lengths == [n + step + 1 for n in sizes] == cache.positions.tolist()


@torch.no_grad()
def test_a_shorter_batch_decodes_its_first_sequences_only():
    layer, x = layer_of(LLAMA), tokens(3, 4)
    cache = KVCache(LLAMA, 3, 8, CPU)
    prefill(layer, x, cache)
    k = cache.k.clone()
    nxt = tokens(2, 1, seed=7)
    out = decode(layer, nxt, cache)
    torch.testing.assert_close(out, layer(torch.cat([x[:2], nxt], dim=1))[:, -1:])
    assert cache.lengths == [5, 5, 4]
    assert torch.equal(cache.k[2], k[2])  # the third sequence untouched


@SPECS
@torch.no_grad()
def test_the_cache_holds_exactly_the_keys_and_values_of_the_tokens_seen(spec):
    layer, x = layer_of(spec), tokens(1, 8)
    cache = KVCache(spec, 2, 12, CPU)
    prefill(layer, x[:, :5], cache)
    for t in range(5, 8):
        decode(layer, x[:, t:t + 1], cache)
    attn = layer.attention  # the training layer's K and V of all 8 tokens at once
    normed = layer.input_norm(x)
    k = attn.key(normed).view(1, 8, attn.groups, attn.head_dim).transpose(1, 2)
    v = attn.value(normed).view(1, 8, attn.groups, attn.head_dim).transpose(1, 2)
    if spec.position_embedding_type == "rope":
        k = rotary(k)
    torch.testing.assert_close(cache.k[:1, :, :8], k)
    torch.testing.assert_close(cache.v[:1, :, :8], v)
    assert cache.k[0, :, 8:].abs().sum() == 0 and cache.v[0, :, 8:].abs().sum() == 0
    assert cache.k[1].abs().sum() == 0  # the other sequence saw nothing
    assert cache.lengths == [8, 0] == cache.positions.tolist()
    assert cache.k.dtype == cache.v.dtype == torch.float32
    assert cache.k.shape == (2, spec.num_query_groups, 12, 16)


def test_rotary_at_positions_is_the_sequences_rotary():
    x = torch.randn(2, 3, 9, 8, generator=torch.Generator().manual_seed(1))
    whole = rotary(x)
    assert torch.equal(rotary(x, torch.arange(9).expand(2, 9)), whole)
    for t in (0, 4, 8):  # one token at its own position, per sequence
        torch.testing.assert_close(rotary(x[:, :, t:t + 1], torch.tensor([[t], [t]])),
                                   whole[:, :, t:t + 1])
    mixed = rotary(x[:, :, :1], torch.tensor([[0], [5]]))  # sequences at other positions
    torch.testing.assert_close(mixed[1], rotary(x[1:, :, :1].expand(1, 3, 6, 8))[0, :, 5:])


@torch.no_grad()
def test_a_full_cache_or_a_bad_shape_is_refused():
    layer = layer_of(LLAMA)
    cache = KVCache(LLAMA, 2, 4, CPU)
    with pytest.raises(ValueError, match="exceeds the cache"):
        prefill(layer, tokens(1, 5), cache)
    with pytest.raises(ValueError, match="exceeds the cache"):
        prefill(layer, tokens(2, 2), cache, first=1)
    prefill(layer, tokens(2, 4), cache)
    with pytest.raises(ValueError, match="no room"):
        decode(layer, tokens(2, 1), cache)
    with pytest.raises(ValueError, match=r"\(B, 1, h\)"):
        decode(layer, tokens(3, 1), cache)
    with pytest.raises(ValueError, match="max_tokens"):
        KVCache(LLAMA, 2, 0, CPU)


@pytest.mark.parametrize("spec", [LLAMA, GPT], ids=["rmsnorm-untied", "layernorm-tied"])
@torch.no_grad()
def test_sample_is_the_argmax_of_the_logits(spec):
    head = stage_parts(spec, 5, CPU)["head"]
    x = tokens(6, 1)[:, 0]
    norm = head.final_norm
    if spec.normalization == "RMSNorm":
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
        w = head.output_layer.weight
    else:
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        normed = (x - mean) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias
        w = head.word_embeddings.weight
    expected = (normed @ w.T).argmax(-1)
    assert torch.equal(sample(head, x), expected)
    assert len(set(expected.tolist())) > 1  # rows pick different tokens


def test_measure_serving_returns_every_point(monkeypatch):
    seen = []  # (B, the lengths each decode call starts from)

    def spy(layer, x, cache):
        seen.append((x.shape[0], list(cache.lengths[:x.shape[0]])))
        return decode(layer, x, cache)
    monkeypatch.setattr(serving_steps, "decode", spy)
    labels = []
    out = measure_serving(LLAMA, CPU, (4, 16), ((1, 8), (3, 20)), (1, 5), warmup=1,
                          repeats=2, step=labels.append)
    assert set(out) == {"prefill", "decode", "head"}
    assert set(out["prefill"]) == {4, 16} and set(out["decode"]) == {(1, 8), (3, 20)}
    assert set(out["head"]) == {1, 5}
    for kind in out.values():
        for samples in kind.values():
            assert len(samples) == 2 and all(0 < s < 10 for s in samples)
    assert len(labels) == 6  # one step per point
    assert seen == [(1, [8])] * 3 + [(3, [20] * 3)] * 3  # each run at context c


@pytest.mark.parametrize("kwargs, words", [
    (dict(prefill_tokens=(0,)), "prefill_tokens"),
    (dict(decode_points=((2, 0),)), "decode_points"),
    (dict(decode_points=((2,),)), "decode_points"),
    (dict(head_rows=(1.5,)), "head_rows"),
    (dict(repeats=0), "repeats"),
    (dict(warmup=-1), "warmup"),
    (dict(warmup=True), "warmup"),
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
