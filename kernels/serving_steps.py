"""Real inference steps in torch at a ModelSpec's shapes (tp 1): one decoder layer with a
KV cache, and the output layer sampling; what `clustersim calibrate --serving` measures
(`measure_serving`) and the serving simulator's step cost prices per layer
(sim.serving.step_cost, fitted by sim.serving.calibration).

- `KVCache(spec, sequences, max_tokens, device)`: one layer's K and V, each (sequences,
  kv heads, max_tokens, head dim) in the model dtype, allocated once; `lengths[i]`: the
  tokens sequence i has cached (host-side bookkeeping, as a serving scheduler keeps),
  mirrored on the device (`positions`, kept by device ops: a step copies nothing from
  the host, so a CUDA timing queues it whole); `set_length` sets both.
- `prefill(layer, x, cache)`: prompts x (b, T, h) of sequences 0..b-1 with empty caches,
  through a kernels.layers.TransformerLayer's own modules: Q, K, V (RoPE at positions
  0..T-1 when the model has it), K and V written to the cache, its causal core attention,
  output projection, residuals and MLP; the computation TransformerLayer.forward does.
- `decode(layer, x, cache)`: x (B, 1, h), the next token of sequences 0..B-1: RoPE at
  position lengths[i], its K and V appended, attention of its query over its lengths[i]
  + 1 keys (a mask hides the cache beyond; none when every sequence has the same length).
- `sample(head, x)`: the last stage's final norm, logits over the vocabulary and greedy
  argmax for rows x (S, h).
Not modelled: paged blocks (one contiguous cache tensor per layer), tensor parallelism,
sampling other than greedy, MoE layers (as kernels.layers).
Units: seconds.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from clustersim.schedules.model import ModelSpec

from .layers import ROPE_BASE, TransformerLayer, torch_dtype
from .microbench import Timer, device_timed, stage_parts


class KVCache:
    """One layer's preallocated K and V for `sequences` sequences of up to `max_tokens`."""

    def __init__(self, spec: ModelSpec, sequences: int, max_tokens: int,
                 device: torch.device):
        head_dim = spec.hidden_size // spec.num_attention_heads
        shape = (sequences, spec.num_query_groups, max_tokens, head_dim)
        self.k = torch.zeros(shape, dtype=torch_dtype(spec), device=device)
        self.v = torch.zeros_like(self.k)
        self.lengths = [0] * sequences
        self.positions = torch.zeros(sequences, dtype=torch.long, device=device)

    def set_length(self, first: int, count: int, tokens: int) -> None:
        """Sequences first .. first + count - 1 hold `tokens` cached tokens."""
        self.lengths[first:first + count] = [tokens] * count
        self.positions[first:first + count].fill_(tokens)

    @property
    def max_tokens(self) -> int:
        return self.k.shape[2]


def rotary_at(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """kernels.layers.rotary's rotation of x (b, heads, s, d) at integer `positions` (b, s)
    instead of 0..s-1."""
    d = x.shape[-1]
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, d, 2, device=x.device,
                                                dtype=torch.float32) / d)
    angles = positions.to(torch.float32)[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # (b, 1, s, d)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _qkv(layer: TransformerLayer, x: torch.Tensor, positions: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q (b, heads, s, d), K and V (b, groups, s, d) of the normed input x (b, s, h)."""
    attn = layer.attention
    b, s, _ = x.shape
    q = attn.query(x).view(b, s, attn.heads, attn.head_dim).transpose(1, 2)
    k = attn.key(x).view(b, s, attn.groups, attn.head_dim).transpose(1, 2)
    v = attn.value(x).view(b, s, attn.groups, attn.head_dim).transpose(1, 2)
    if attn.rope:
        q, k = rotary_at(q, positions), rotary_at(k, positions)
    return q, k, v


def _finish(layer: TransformerLayer, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """The output projection and residual, then the MLP block, of input x (b, s, h)."""
    x = x + layer.attention.proj(attended)
    return x + layer.mlp(layer.mlp_norm(x))


def prefill(layer: TransformerLayer, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Prompts x (b, T, h) of cache sequences 0..b-1 (module docstring)."""
    b, length, _ = x.shape
    if length > cache.max_tokens or b > len(cache.lengths):
        raise ValueError(f"a prefill of {b} x {length} tokens exceeds the cache "
                         f"({len(cache.lengths)} x {cache.max_tokens})")
    positions = torch.arange(length, device=x.device).expand(b, length)
    q, k, v = _qkv(layer, layer.input_norm(x), positions)
    cache.k[:b, :, :length] = k
    cache.v[:b, :, :length] = v
    cache.set_length(0, b, length)
    return _finish(layer, x, layer.attention.core(q, k, v))


def decode(layer: TransformerLayer, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One new token x (B, 1, h) of each of cache sequences 0..B-1 (module docstring)."""
    count = x.shape[0]
    lengths = cache.lengths[:count]
    if x.shape[1] != 1 or count > len(cache.lengths) or max(lengths) >= cache.max_tokens:
        raise ValueError(f"decode takes (B, 1, h) for B <= {len(cache.lengths)} sequences "
                         f"with room in the cache, got {tuple(x.shape)} at lengths "
                         f"up to {max(lengths)} of {cache.max_tokens}")
    where = cache.positions[:count].clone()
    q, k, v = _qkv(layer, layer.input_norm(x), where[:, None])
    rows = torch.arange(count, device=x.device)
    cache.k[rows, :, where] = k[:, :, 0]
    cache.v[rows, :, where] = v[:, :, 0]
    cache.lengths[:count] = [n + 1 for n in lengths]
    cache.positions[:count] += 1
    keys = max(lengths) + 1
    k, v = cache.k[:count, :, :keys], cache.v[:count, :, :keys]
    attn = layer.attention
    if attn.groups != attn.heads:
        k = k.repeat_interleave(attn.heads // attn.groups, dim=1)
        v = v.repeat_interleave(attn.heads // attn.groups, dim=1)
    mask = None
    if min(lengths) != max(lengths):  # each query sees its own lengths[i] + 1 keys
        mask = (torch.arange(keys, device=x.device)[None] <= where[:, None])[:, None, None]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return _finish(layer, x, out.transpose(1, 2).reshape(count, 1, attn.heads * attn.head_dim))


def sample(head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Greedy next tokens (S,) of rows x (S, h) through the last stage `head`
    (kernels.stage.StageModule): final norm, output layer, argmax."""
    return F.linear(head.final_norm(x), head._head_weight()).argmax(dim=-1)


def _positive(name: str, values: Sequence, least: int = 1) -> None:
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be integers >= {least}, got {value!r}")


def measure_serving(model: ModelSpec, device: torch.device, prefill_tokens: Sequence[int],
                    decode_points: Sequence[tuple[int, int]], head_rows: Sequence[int],
                    warmup: int, repeats: int, seed: int = 0,
                    step: Callable[[str], None] = lambda label: None) -> dict:
    """Seconds of each step, `warmup` untimed then `repeats` timed runs (host clock on a
    CPU; on CUDA the device's, kernels.microbench.device_timed): {'prefill': {T: [s..]},
    'decode': {(B, c): [s..]}, 'head': {S: [s..]}} for one prompt of T tokens, B sequences
    after c cached tokens each (the cache filled untimed, reset to c before each run), and
    S rows sampled. `step(label)` after each point."""
    if model.is_moe:
        raise ValueError("mixture-of-experts layers are not implemented in the kernels "
                         "backend (num_experts is set)")
    _positive("prefill_tokens", prefill_tokens)
    _positive("head_rows", head_rows)
    _positive("decode_points' batch and context", [n for p in decode_points for n in p])
    _positive("repeats", [repeats])
    _positive("warmup", [warmup], 0)
    parts = stage_parts(model, seed, device)
    layer = next(iter(parts["layer"].layers.values()))
    dtype, h = torch_dtype(model), model.hidden_size
    gen = torch.Generator().manual_seed(seed)
    timer = Timer(device)
    sequences = max([1, *(b for b, _ in decode_points)])
    longest = max([1, *prefill_tokens, *(c + 1 for _, c in decode_points)])
    cache = KVCache(model, sequences, longest, device)
    out: dict = {"prefill": {}, "decode": {}, "head": {}}

    def timed(call: Callable[[], object]) -> list[float]:
        runs = [device_timed(timer, 1, lambda _: call())[0] for _ in range(warmup + repeats)]
        return runs[warmup:]

    with torch.inference_mode():
        for length in prefill_tokens:
            x = torch.randn(1, length, h, generator=gen).to(device, dtype)
            out["prefill"][length] = timed(lambda: prefill(layer, x, cache))
            step(f"prefill {length} tokens")
        for batch, context in decode_points:
            cache.k.normal_(generator=None)
            cache.v.normal_(generator=None)
            x = torch.randn(batch, 1, h, generator=gen).to(device, dtype)

            def one_decode() -> torch.Tensor:
                cache.set_length(0, batch, context)
                return decode(layer, x, cache)
            out["decode"][(batch, context)] = timed(one_decode)
            step(f"decode {batch} x {context}")
        for rows in head_rows:
            x = torch.randn(rows, h, generator=gen).to(device, dtype)
            out["head"][rows] = timed(lambda: sample(parts["head"], x))
            step(f"head {rows} rows")
    return out
