"""Real inference steps in torch at a ModelSpec's shapes (tp 1): one decoder layer with a
KV cache, and the output layer sampling; what `clustersim calibrate --serving` measures
(`measure_serving`) and the serving simulator's step cost prices per layer
(sim.serving.step_cost, fitted by sim.serving.calibration).

- `KVCache(spec, sequences, max_tokens, device)`: one layer's K and V, each (sequences,
  kv heads, max_tokens, head dim) in the model dtype, allocated once (a model keeps one
  per layer); `lengths[i]`: the tokens sequence i has cached (host-side bookkeeping, as a
  serving scheduler keeps), mirrored on the device (`positions`, advanced by device ops:
  a step copies nothing from the host, so a CUDA timing queues it whole); `set_length`
  sets both. Sequences of different lengths share the padded tensor.
- `prefill(layer, x, cache, first=0)`: prompts x (b, T, h) into cache sequences first ..
  first+b-1 (their earlier contents are overwritten), through a kernels.layers
  TransformerLayer's own modules: Q, K, V (RoPE at positions 0..T-1 when the model has
  it), K and V written to the cache, its causal CoreAttention, output projection,
  residuals and MLP: the computation TransformerLayer.forward does.
- `decode(layer, x, cache)`: x (B, 1, h), the next token of sequences 0..B-1: RoPE at
  position lengths[i], its K and V appended, attention of its query over its
  lengths[i] + 1 keys (a boolean mask hides the padding beyond when the lengths differ).
  GQA without expanding the cache: a group's heads/groups query heads attend as that many
  queries of its one K/V head, so the cache is read once (as serving kernels do; a
  repeat_interleave would copy it heads/groups times each step).
- `sample(head, x)`: the last stage's (kernels.stage.StageModule) final norm, logits over
  the vocabulary and greedy argmax for rows x (S, h).

Not modelled: paged blocks (one contiguous tensor per layer), tensor or sequence
parallelism, a step mixing prefill and decode tokens (chunked prefill), prefixes already
cached, sampling other than greedy, the embedding lookup, MoE layers (as kernels.layers).
Units: seconds. On CUDA the times are the device's (kernels.microbench.device_timed), not
the host's launch time, which a small decode step without CUDA graphs may be bound by.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F

from clustersim.schedules.model import ModelSpec

from .layers import TransformerLayer, rotary, torch_dtype
from .microbench import Timer, device_timed
from .stage import StageModule, build_stages


def _check_counts(name: str, values: Sequence, least: int = 1) -> None:
    """ValueError naming `name` unless every value is an int >= `least`."""
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be integers >= {least}, got {value!r}")


class KVCache:
    """One layer's preallocated K and V for `sequences` sequences of up to `max_tokens`
    tokens each (module docstring)."""

    def __init__(self, spec: ModelSpec, sequences: int, max_tokens: int,
                 device: torch.device | str = "cpu"):
        _check_counts("sequences", [sequences])
        _check_counts("max_tokens", [max_tokens])
        head_dim = spec.hidden_size // spec.num_attention_heads
        shape = (sequences, spec.num_query_groups, max_tokens, head_dim)
        self.k = torch.zeros(shape, dtype=torch_dtype(spec), device=device)
        self.v = torch.zeros_like(self.k)
        self.lengths = [0] * sequences
        self.positions = torch.zeros(sequences, dtype=torch.long, device=device)

    @property
    def sequences(self) -> int:
        return self.k.shape[0]

    @property
    def max_tokens(self) -> int:
        return self.k.shape[2]

    def set_length(self, first: int, count: int, tokens: int) -> None:
        """Sequences first .. first + count - 1 hold `tokens` cached tokens (what the cache
        holds beyond is ignored, and overwritten by the next steps)."""
        if not (0 <= first and count >= 1 and first + count <= self.sequences
                and 0 <= tokens <= self.max_tokens):
            raise ValueError(f"sequences {first}..{first + count - 1} with {tokens} tokens "
                             f"are outside the cache ({self.sequences} x {self.max_tokens})")
        self.lengths[first:first + count] = [tokens] * count
        self.positions[first:first + count].fill_(tokens)


def _qkv(layer: TransformerLayer, x: torch.Tensor, positions: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q (b, heads, s, d), K and V (b, groups, s, d) of the normed input x (b, s, h), RoPE
    at `positions` (b, s) (None: 0..s-1, as the training layer) when the model has it."""
    attn = layer.attention
    b, s, _ = x.shape
    q = attn.query(x).view(b, s, attn.heads, attn.head_dim).transpose(1, 2)
    k = attn.key(x).view(b, s, attn.groups, attn.head_dim).transpose(1, 2)
    v = attn.value(x).view(b, s, attn.groups, attn.head_dim).transpose(1, 2)
    if attn.rope:
        q, k = rotary(q, positions), rotary(k, positions)
    return q, k, v


def _finish(layer: TransformerLayer, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """The output projection and residual, then the MLP block, of input x (b, s, h)."""
    x = x + layer.attention.proj(attended)
    return x + layer.mlp(layer.mlp_norm(x))


def prefill(layer: TransformerLayer, x: torch.Tensor, cache: KVCache, first: int = 0
            ) -> torch.Tensor:
    """Prompts x (b, T, h) of cache sequences first..first+b-1 -> (b, T, h) (module
    docstring)."""
    if x.dim() != 3 or x.shape[1] < 1:
        raise ValueError(f"prefill takes x (b, T, h), got {tuple(x.shape)}")
    b, length, _ = x.shape
    if length > cache.max_tokens or not 0 <= first <= cache.sequences - b:
        raise ValueError(f"a prefill of {b} x {length} tokens from sequence {first} exceeds "
                         f"the cache ({cache.sequences} x {cache.max_tokens})")
    q, k, v = _qkv(layer, layer.input_norm(x), None)
    cache.k[first:first + b, :, :length] = k
    cache.v[first:first + b, :, :length] = v
    cache.set_length(first, b, length)
    return _finish(layer, x, layer.attention.core(q, k, v))


def decode(layer: TransformerLayer, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One new token x (B, 1, h) of each of cache sequences 0..B-1 -> (B, 1, h) (module
    docstring)."""
    count = x.shape[0]
    if x.dim() != 3 or x.shape[1] != 1 or not 1 <= count <= cache.sequences:
        raise ValueError(f"decode takes x (B, 1, h) for B <= {cache.sequences} sequences, "
                         f"got {tuple(x.shape)}")
    lengths = cache.lengths[:count]
    if max(lengths) >= cache.max_tokens:
        raise ValueError(f"no room in the cache ({cache.max_tokens} tokens) for a sequence "
                         f"of {max(lengths)} cached tokens")
    where = cache.positions[:count].clone()  # (B,): each new token's position
    q, k, v = _qkv(layer, layer.input_norm(x), where[:, None])
    rows = torch.arange(count, device=x.device)
    cache.k[rows, :, where] = k[:, :, 0]
    cache.v[rows, :, where] = v[:, :, 0]
    cache.lengths[:count] = [n + 1 for n in lengths]
    cache.positions[:count] += 1
    keys = max(lengths) + 1
    attn = layer.attention
    # (B, groups, heads/groups, d): head j = g * heads/groups + i uses K/V group g, as
    # CoreAttention's repeat_interleave pairs them
    q = q.reshape(count, attn.groups, attn.heads // attn.groups, attn.head_dim)
    mask = None
    if min(lengths) != max(lengths):  # each query sees its own lengths[i] + 1 keys
        mask = (torch.arange(keys, device=x.device) <= where[:, None])[:, None, None]
    out = F.scaled_dot_product_attention(q, cache.k[:count, :, :keys],
                                         cache.v[:count, :, :keys], attn_mask=mask)
    return _finish(layer, x, out.reshape(count, 1, attn.heads * attn.head_dim))


def sample(head: StageModule, x: torch.Tensor) -> torch.Tensor:
    """Greedy next tokens (S,) of rows x (S, h) through the last stage `head`: its final
    norm, output layer (the tied word embedding or its own), argmax over the vocabulary."""
    return F.linear(head.final_norm(x), head._head_weight()).argmax(dim=-1)


def measure_serving(model: ModelSpec, device: torch.device, prefill_tokens: Sequence[int],
                    decode_points: Sequence[tuple[int, int]], head_rows: Sequence[int],
                    warmup: int, repeats: int, seed: int = 0,
                    step: Callable[[str], None] = lambda label: None) -> dict:
    """Seconds of each step, `warmup` untimed then `repeats` timed runs (host clock on a
    CPU; on CUDA the device's, kernels.microbench.device_timed): {'prefill': {T: [s..]},
    'decode': {(B, c): [s..]}, 'head': {S: [s..]}} for one prompt of T tokens, B sequences
    making one token each after c cached (the cache filled with random K/V and reset to c
    before each run, untimed), and S rows sampled. One layer of the model (seed's
    weights, kernels.stage's split (0, 1, 0) of a one-layer model, so the names and values
    are a training run's) and its last stage; `step(label)` after each point."""
    if model.is_moe:
        raise ValueError("mixture-of-experts layers are not implemented in the kernels "
                         "backend (num_experts is set)")
    _check_counts("prefill_tokens", prefill_tokens)
    _check_counts("head_rows", head_rows)
    for point in decode_points:
        if not (isinstance(point, (tuple, list)) and len(point) == 2):
            raise ValueError(f"decode_points must be (batch, context) pairs, got {point!r}")
        _check_counts("decode_points' batch and context", point)
    _check_counts("repeats", [repeats])
    _check_counts("warmup", [warmup], 0)
    device = torch.device(device)
    dtype, h = torch_dtype(model), model.hidden_size
    stages = build_stages(replace(model, num_layers=1), [1, 2], 3, seed, device, split=(0, 1, 0))
    layer, head = stages[1].layers["0"], stages[2]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the cache's random K/V, drawn on the device
    timer = Timer(device)
    sequences = max([1, *(b for b, _ in decode_points)])
    longest = max([1, *prefill_tokens, *(c + 1 for _, c in decode_points)])
    cache = KVCache(model, sequences, longest, device)
    out: dict = {"prefill": {}, "decode": {}, "head": {}}

    def timed(call: Callable[[], object], reset: Callable[[], None] = lambda: None
              ) -> list[float]:
        runs = []
        for _ in range(warmup + repeats):
            reset()
            runs.append(device_timed(timer, 1, lambda _: call())[0])
        return runs[warmup:]

    with torch.inference_mode():
        for length in prefill_tokens:
            x = torch.randn(1, length, h, generator=gen).to(device, dtype)
            out["prefill"][length] = timed(lambda: prefill(layer, x, cache))
            step(f"prefill {length} tokens")
        cache.k.normal_()
        cache.v.normal_()
        for batch, context in decode_points:
            x = torch.randn(batch, 1, h, generator=gen).to(device, dtype)
            out["decode"][(batch, context)] = timed(
                lambda: decode(layer, x, cache),
                lambda: cache.set_length(0, batch, context))
            step(f"decode {batch} x {context}")
        for rows in head_rows:
            x = torch.randn(rows, h, generator=gen).to(device, dtype)
            out["head"][rows] = timed(lambda: sample(head, x))
            step(f"head {rows} rows")
    return out
