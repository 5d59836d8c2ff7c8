"""Megatron-style transformer-layer shards in torch, at a ModelSpec's shapes.

Activations are batch-first `(b, s, h)`: b micro-batch, s sequence, h hidden (elements of
the model dtype). A layer is pre-norm attention (QKV projection with grouped-query
attention, causal `scaled_dot_product_attention`, output projection) then a pre-norm MLP
(GeLU, or SwiGLU), each with a residual connection, as in Megatron-LM's
`TransformerLayer`. There is no dropout (no RNG in the forward), so runs are
deterministic; torch's checkpoint would restore the RNG state for a recompute anyway.

Activation recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", section 5; Megatron-LM's --recompute-granularity): with
'selective' each layer's `CoreAttention` (from Q, K, V to the attention output before
the output projection: GQA expansion, QK^T, softmax, attention over V; Megatron-Core's
`_checkpointed_attention_forward`) runs under `checkpointed`, so its activations are not
kept and the backward recomputes it; with 'full' kernels.stage checkpoints every layer.
`checkpointed` is torch.utils.checkpoint (use_reentrant=False, RNG state preserved) with
early stop off: the recompute runs the whole function, including a trailing TP
collective that saves no tensor (the MLP's all-reduce / reduce-scatter), as Megatron's
CheckpointFunction does and schedules.tp_comms charges.

Tensor parallelism (Shoeybi et al. 2019, "Megatron-LM"): `ColumnParallelLinear` splits
the output features over the TP group's ranks, `RowParallelLinear` the input features;
attention heads and GQA K/V groups split with them (rank r holds heads r*a/t.. and the
groups they use). The communication is kernels.tensor_parallel's: a block (attention, MLP)
enters the TP region once before its column linears (as Megatron's fused QKV / fc1 GEMM
does: one all-reduce in the backward, or one SP all-gather, not one per linear) and the
row linear exits it (all-reduce, or SP reduce-scatter) before adding its bias. With
sequence parallelism (Korthikanti et al. 2022) the norms and residuals see (b, s/t, h)
and their replicated parameters' gradients are summed over TP (kernels.tensor_parallel).

Every parameter carries its *full* (unsharded) shape, the dimension it is sharded along
(or, on a 2D grid, its `blocks`: kernels.layers_2d) and its init rule, so
`init_parameters` can draw the full tensor from a generator seeded by (seed, parameter
name) and keep this rank's block: every rank, every pipeline split and the single-process
reference build bit-identical weights.
"""
from __future__ import annotations

import zlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from clustersim.schedules.model import RECOMPUTE, ModelSpec

from .tensor_parallel import TensorParallel, replicated_in_sequence

INIT_STD = 0.02  # Megatron-LM's --init-method-std default
NORM_EPS = 1e-5
ROPE_BASE = 10000.0

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(spec: ModelSpec) -> torch.dtype:
    """The torch dtype of the model's parameters and activations (fp8 is not supported)."""
    if spec.dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype={spec.dtype!r} is not supported by the kernels backend: "
                         f"use one of {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[spec.dtype]


def check_recompute(recompute: str) -> str:
    """`recompute` if it is one of RECOMPUTE ('none', 'selective', 'full'), else ValueError."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r} must be one of {', '.join(RECOMPUTE)}")
    return recompute


def checkpointed(fn: nn.Module, *args: torch.Tensor) -> torch.Tensor:
    """fn(*args) without keeping its activations: the backward runs it again (module
    docstring); a plain call when autograd records nothing (no_grad)."""
    if not torch.is_grad_enabled():
        return fn(*args)
    with set_checkpoint_early_stop(False):
        return checkpoint(fn, *args, use_reentrant=False)


def sharded_parameter(full_shape: tuple[int, ...], init: str, tp_size: int = 1,
                      shard_dim: int | None = None) -> nn.Parameter:
    """A parameter holding one TP shard of a `full_shape` tensor; init is normal|zeros|ones."""
    shape = list(full_shape)
    if shard_dim is not None:
        if shape[shard_dim] % tp_size:
            raise ValueError(f"dimension {shape[shard_dim]} is not divisible by tp={tp_size}")
        shape[shard_dim] //= tp_size
    p = nn.Parameter(torch.empty(shape))
    p.full_shape, p.shard_dim, p.init = tuple(full_shape), shard_dim, init
    return p


def block_parameter(full_shape: tuple[int, ...], init: str,
                    blocks: tuple[tuple[int, int, int], ...]) -> nn.Parameter:
    """A parameter holding one block of a `full_shape` tensor: along each `dim` of
    `blocks` = ((dim, index, parts), ...) part `index` of `parts` equal parts."""
    shape = list(full_shape)
    for dim, index, parts in blocks:
        if shape[dim] % parts or not 0 <= index < parts:
            raise ValueError(f"dimension {shape[dim]} has no part {index} of {parts} equal "
                             f"parts")
        shape[dim] //= parts
    p = nn.Parameter(torch.empty(shape))
    p.full_shape, p.shard_dim, p.init, p.blocks = tuple(full_shape), None, init, tuple(blocks)
    return p


def parameter_blocks(p: torch.Tensor, tp_rank: int) -> tuple[tuple[int, int, int], ...]:
    """((dim, index, parts), ...) of the full tensor that `p` holds on TP rank `tp_rank`:
    its `blocks`, or part tp_rank along its shard dim; () for a whole tensor."""
    if getattr(p, "blocks", None) is not None:
        return p.blocks
    dim, full = getattr(p, "shard_dim", None), getattr(p, "full_shape", tuple(p.shape))
    if dim is None or p.shape[dim] == full[dim]:
        return ()
    return ((dim, tp_rank, full[dim] // p.shape[dim]),)


def _tp_of(tp: TensorParallel | None, tp_size: int, tp_rank: int) -> TensorParallel:
    return tp if tp is not None else TensorParallel(tp_size, tp_rank)


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A's output features split over `tp_size` ranks (this is shard
    `tp_rank`; or `tp`'s size and rank); the output stays split (no gather), as Megatron
    feeds it to a row linear. `x` is already in the TP region (the caller's `tp.enter`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp_size: int = 1,
                 tp_rank: int = 0, tp: TensorParallel | None = None):
        super().__init__()
        self.tp = _tp_of(tp, tp_size, tp_rank)
        size = self.tp.size
        self.weight = sharded_parameter((out_features, in_features), "normal", size, 0)
        self.bias = sharded_parameter((out_features,), "zeros", size, 0) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A's input features split over `tp_size` ranks; the partial sums
    are all-reduced over the TP group and the (unsplit) bias added once after."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp_size: int = 1,
                 tp_rank: int = 0, tp: TensorParallel | None = None):
        super().__init__()
        self.tp = _tp_of(tp, tp_size, tp_rank)
        self.weight = sharded_parameter((out_features, in_features), "normal", self.tp.size, 1)
        self.bias = replicated_in_sequence(sharded_parameter((out_features,), "zeros")
                                           if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.exit(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class Norm(nn.Module):
    """LayerNorm (weight and bias) or RMSNorm (weight only), eps 1e-5, over the last dim
    (with sequence parallelism: of this rank's tokens; its parameters are marked
    replicated_in_sequence, their gradients summed over TP by the executor)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        h = spec.hidden_size
        self.rms = spec.normalization == "RMSNorm"
        self.weight = replicated_in_sequence(sharded_parameter((h,), "ones"))
        self.bias = replicated_in_sequence(None if self.rms else sharded_parameter((h,), "zeros"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rms:
            return F.rms_norm(x, x.shape[-1:], self.weight, NORM_EPS)
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, NORM_EPS)


def rotary(x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021; Megatron's rotate-half form) of
    `x` shaped (b, heads, s, d), base 10000, at positions 0..s-1, or at the integer
    `positions` (b, s) of each token (a KV-cache step: kernels.serving_steps)."""
    d, s = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    if positions is None:
        angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv_freq)
    else:  # (b, 1, s, d/2): the same angles for every head
        angles = (positions.to(torch.float32)[..., None] * inv_freq)[:, None]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class CoreAttention(nn.Module):
    """Q (b, heads, s, d), K and V (b, groups, s, d) -> the attention output (b, s,
    heads*d) before the output projection: K/V expanded to the heads (GQA), causal
    softmax(QK^T / sqrt(d)) V. No parameters; what selective recompute recomputes."""

    def __init__(self, heads: int, groups: int):
        super().__init__()
        self.heads, self.groups = heads, groups

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.groups != self.heads:
            k = k.repeat_interleave(self.heads // self.groups, dim=1)
            v = v.repeat_interleave(self.heads // self.groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b, _, s, d = out.shape
        return out.transpose(1, 2).reshape(b, s, self.heads * d)


class Attention(nn.Module):
    """Causal self-attention with num_query_groups K/V heads (GQA), heads split over TP;
    `recompute='selective'` checkpoints its CoreAttention."""

    def __init__(self, spec: ModelSpec, tp: TensorParallel | None = None,
                 recompute: str = "none"):
        super().__init__()
        h, bias = spec.hidden_size, spec.add_bias_linear
        self.tp = tp = _tp_of(tp, 1, 0)
        self._init_heads(spec, tp.size, f"tp={tp.size}", recompute)
        # Q, K and V of one rank's heads; separate linears keep each TP shard's Q/K/V whole
        self.query = ColumnParallelLinear(h, h, bias, tp=tp)
        self.key = ColumnParallelLinear(h, spec.kv_hidden_size, bias, tp=tp)
        self.value = ColumnParallelLinear(h, spec.kv_hidden_size, bias, tp=tp)
        self.proj = RowParallelLinear(h, h, bias, tp=tp)

    def _init_heads(self, spec: ModelSpec, shards: int, split: str, recompute: str) -> None:
        """This rank's 1/`shards` of the heads and K/V groups (`split` names the divisor
        in the error), RoPE, and the core attention (checkpointed when selective)."""
        h, a, g = spec.hidden_size, spec.num_attention_heads, spec.num_query_groups
        if a % shards or g % shards:
            raise ValueError(f"heads={a} and query groups={g} must be divisible by {split}")
        self.head_dim = h // a
        self.heads, self.groups = a // shards, g // shards
        self.rope = spec.position_embedding_type == "rope"
        self.core = CoreAttention(self.heads, self.groups)
        self.selective = check_recompute(recompute) == "selective"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.enter(x)  # (b, s, h) on every TP rank, also with SP
        return self.proj(self.attend(self.query(x), self.key(x), self.value(x)))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Q (b, s, heads*d), K and V (b, s, groups*d) of this rank's heads -> the
        attention output (b, s, heads*d) before the output projection."""
        b, s, _ = q.shape
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.groups, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.groups, self.head_dim).transpose(1, 2)
        if self.rope:
            q, k = rotary(q), rotary(k)
        return checkpointed(self.core, q, k, v) if self.selective else self.core(q, k, v)


class MLP(nn.Module):
    """h -> f -> h with GeLU, or SwiGLU (silu(gate) * up) when spec.swiglu."""

    def __init__(self, spec: ModelSpec, tp: TensorParallel | None = None):
        super().__init__()
        h, f, bias = spec.hidden_size, spec.ffn_hidden_size, spec.add_bias_linear
        self.swiglu, self.tp = spec.swiglu, _tp_of(tp, 1, 0)
        self.fc1 = ColumnParallelLinear(h, f, bias, tp=self.tp)
        self.gate = ColumnParallelLinear(h, f, bias, tp=self.tp) if spec.swiglu else None
        self.fc2 = RowParallelLinear(f, h, bias, tp=self.tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.enter(x)
        if self.swiglu:
            return self.fc2(F.silu(self.gate(x)) * self.fc1(x))
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    """x + attn(norm(x)), then + mlp(norm(.)): one decoder layer (dense; MoE unsupported).
    `recompute='selective'` checkpoints its core attention; 'full' is the caller's
    (kernels.stage checkpoints the whole layer)."""

    def __init__(self, spec: ModelSpec, tp: TensorParallel | None = None,
                 recompute: str = "none"):
        super().__init__()
        self._assemble(spec, lambda: Norm(spec), Attention(spec, tp, recompute), MLP(spec, tp))

    def _assemble(self, spec: ModelSpec, norm: Any, attention: nn.Module, mlp: nn.Module
                  ) -> None:
        """The layer of two `norm()`s, `attention` and `mlp` (a grid's layer passes its
        own: kernels.layers_2d, layers_3d)."""
        if spec.is_moe:
            raise ValueError("mixture-of-experts layers are not implemented in the kernels "
                             "backend (num_experts is set)")
        self.input_norm, self.attention, self.mlp_norm, self.mlp = norm(), attention, norm(), mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.input_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def seed_for(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 63)


@torch.no_grad()
def init_parameters(module: nn.Module, seed: int, tp_rank: int = 0) -> None:
    """Fill every parameter from a generator seeded by (seed, its name): draw the full
    tensor (normal(0, 0.02), zeros or ones) and keep this rank's block (parameter_blocks)."""
    for name, p in module.named_parameters():
        rule = getattr(p, "init", "normal")
        full_shape = getattr(p, "full_shape", tuple(p.shape))
        if rule == "normal":
            gen = torch.Generator().manual_seed(seed_for(seed, name))
            full = torch.randn(full_shape, generator=gen) * INIT_STD
        else:
            full = (torch.ones if rule == "ones" else torch.zeros)(full_shape)
        for dim, index, parts in parameter_blocks(p, tp_rank):
            size = full.shape[dim] // parts
            full = full.narrow(dim, index * size, size)
        p.copy_(full.to(p.dtype))


def count_parameters(module: nn.Module) -> int:
    """Elements of the module's (unique) parameters."""
    return sum(p.numel() for p in module.parameters())

