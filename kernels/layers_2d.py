"""The transformer layer of kernels.layers on a 2D tensor-parallel grid (Optimus SUMMA,
Colossal-AI's 2D layers: docs/research/tensor_parallel_nd.md section 1.1; Colossal-AI's
legacy parallel_2d/layers.py and _operation.py), and on each depth slice of a 2.5D one
(Tesseract, kernels.linear_nd.Grid25D: the same layers on the slice's 1/d of the
micro-batch, vectors as below).

Rank (i, j) of the q x q grid (kernels.summa.SummaGrid) holds block (i, j) of every
activation: (b/q, s, h/q), samples block i (over rows), hidden block j (over columns).
- A linear's weight A (out x in; torch's layout, y = x A^T) is held as block (j, i),
  (out/q x in/q): the transpose of block (i, j) of W = A^T (in x out), the SUMMA operand.
  Its output y = x W is a SUMMA product (kernels.summa): q broadcasts of x blocks over
  'tp_row' and of W blocks over 'tp_col' forward, broadcasts and reduces backward.
  Q, K and V are one product (schedules.tp_grid.layer_linears' QKV), as are SwiGLU's gate
  and up projections: their blocks are concatenated, so output block j holds the heads,
  K/V groups and FFN columns of block j, and attention runs locally on a/q heads.
- A vector (norm weight, bias: n elements) is cut in q^2 parts, rank (i, j) holding part
  j q + i; all-gathering it over 'tp_col' gives hidden block j (n/q) forward, and the
  gradient is reduce-scattered there backward (Colossal-AI's add_bias_2d); one all-gather
  per bias of a product (the QKV biases are one), one per norm weight. On 2.5D a vector
  is cut in q parts, every rank holding part col; row 0's is broadcast over 'tp_col' and
  the gradient reduced back to it (Colossal-AI's add_bias_2p5d; the other rows' copies
  are never read: `layer_vector`).
- LayerNorm / RMSNorm normalise over the hidden dimension split over the row: the
  per-token sums (fp32, T/q values each) are all-reduced over 'tp_row', 2 forward and 2
  backward for LayerNorm (mean and variance; the two sums of the input gradient), 1 and
  1 for RMSNorm (LayerNorm2D in Colossal-AI).
The input and weight gradients are separate autograd nodes everywhere, so a zero-bubble
I then W (kernels.split_backward) runs each collective in the op schedules.tp_2d charges.
Parameters carry their `blocks` (kernels.layers.block_parameter), so init_parameters
draws the full tensor and every rank keeps its block. Units: elements of the model dtype,
statistics fp32.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from clustersim.schedules.model import ModelSpec

from .layers import NORM_EPS, Attention, TransformerLayer, block_parameter
from .summa import SummaGrid, summa_matmul
from .tensor_parallel import TensorParallel


def grid_matrix(full_shape: tuple[int, int], grid: SummaGrid) -> nn.Parameter:
    """Block (col, row) of an (out, in) weight: the transpose of W's block (row, col)."""
    q = grid.q
    return block_parameter(full_shape, "normal", ((0, grid.col, q), (1, grid.row, q)))


def grid_vector(full_shape: tuple[int, ...], init: str, grid: SummaGrid) -> nn.Parameter:
    """Part col*q + row of q^2 along the last dim of a vector (or a table's rows)."""
    return block_parameter(full_shape, init, ((len(full_shape) - 1, grid.col * grid.q
                                               + grid.row, grid.q * grid.q),))


def gather_vectors(vectors: list[torch.Tensor], grid: SummaGrid, site: str) -> torch.Tensor:
    """Hidden block col of each of `vectors` (grid_vector parts), concatenated in order:
    one all-gather over 'tp_col' (its gradient: one reduce-scatter there)."""
    sizes = [v.shape[-1] for v in vectors]
    gathered = grid.col_group.gather(torch.cat(vectors, dim=-1), site, -1)
    by_row = gathered.reshape(*gathered.shape[:-1], grid.q, sum(sizes))
    return torch.cat([part.flatten(-2) for part in by_row.split(sizes, dim=-1)], dim=-1)


def layer_vector(full_shape: tuple[int, ...], init: str, grid: SummaGrid) -> nn.Parameter:
    """A norm weight's or bias's block: on a 2D grid part col q + row of q^2 (grid_vector);
    on 2.5D hidden block col of q on every rank, read from row 0 only (Colossal-AI's
    add_bias_2p5d and LayerNorm2p5D broadcast it from there), so the copies on other rows
    are marked `unread_copy` (kernels.results leaves them out)."""
    if grid.depth == 1:
        return grid_vector(full_shape, init, grid)
    p = block_parameter(full_shape, init, ((len(full_shape) - 1, grid.col, grid.q),))
    p.unread_copy = grid.row != 0
    return p


def spread_vectors(vectors: list[torch.Tensor], grid: SummaGrid, site: str) -> torch.Tensor:
    """Hidden block col of each of `vectors` (layer_vector blocks), concatenated in order:
    on 2D gather_vectors; on 2.5D one broadcast from row 0 over 'tp_col' (its gradient:
    one reduce there to row 0, zero on the other rows)."""
    if grid.depth == 1:
        return gather_vectors(vectors, grid, site)
    return _FromRowZero.apply(torch.cat(vectors, dim=-1), grid.col_group, site)


class _FromRowZero(torch.autograd.Function):
    """Row 0's tensor on every row of the column: broadcast forward, reduce to row 0
    backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, col: TensorParallel, site: str) -> torch.Tensor:
        ctx.col, ctx.site = col, site
        return col.broadcast(x, 0, site).clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        summed = ctx.col.reduce(grad, 0, ctx.site)
        if summed is None:
            summed = grad.new_zeros(grad.shape)  # contiguous, whatever grad's strides
        return summed, None, None


class GridLinear(nn.Module):
    """The blocks of one linear's weight (grid_matrix) and bias (grid_vector) on this
    rank; `grid_linear` computes with one or several of them."""

    def __init__(self, in_features: int, out_features: int, bias: bool, grid: SummaGrid):
        super().__init__()
        self.weight = grid_matrix((out_features, in_features), grid)
        self.bias = layer_vector((out_features,), "zeros", grid) if bias else None


def grid_linear(x: torch.Tensor, linears: list[GridLinear], grid: SummaGrid,
                site: str = "layer") -> tuple[torch.Tensor, ...]:
    """Each linear's output block for input block `x` (..., in/q): one SUMMA product of
    their concatenated weights, plus their gathered biases."""
    w = torch.cat([lin.weight for lin in linears]).t()
    y = summa_matmul(x, w, grid, site)
    if linears[0].bias is not None:
        y = y + spread_vectors([lin.bias for lin in linears], grid, site)
    return y.split([lin.weight.shape[0] for lin in linears], dim=-1)


class GridNorm(nn.Module):
    """LayerNorm (weight, bias) or RMSNorm (weight) of the grid's activation blocks, eps
    1e-5: statistics all-reduced over 'tp_row', weights gathered over 'tp_col'."""

    def __init__(self, spec: ModelSpec, grid: SummaGrid, site: str = "layer"):
        super().__init__()
        h = self.hidden = spec.hidden_size
        self.grid, self.site, self.rms = grid, site, spec.normalization == "RMSNorm"
        self.weight = layer_vector((h,), "ones", grid)
        self.bias = None if self.rms else layer_vector((h,), "zeros", grid)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = normalize(x, self.grid.row_group, self.hidden, self.rms, self.site)
        x = x * spread_vectors([self.weight], self.grid, self.site)
        return x if self.bias is None else x + spread_vectors([self.bias], self.grid, self.site)


def normalize(x: torch.Tensor, group: TensorParallel, hidden: int, rms: bool, site: str,
              fused: bool = False) -> torch.Tensor:
    """LayerNorm (or RMSNorm with `rms`) without weights of `x`, whose hidden dimension of
    `hidden` elements is split over `group`, eps 1e-5: its per-token statistics are
    all-reduced there, 2 all-reduces forward (the mean, then the centred variance) and 2
    backward for LayerNorm (Colossal-AI's LayerNorm2D), or with `fused` one of both sums
    stacked each way (2 values per token; LayerNorm3D: the variance as
    E[x^2] - E[x]^2); 1 and 1 for RMSNorm."""
    return _Normalize.apply(x, group, hidden, rms, site, fused)


class _Normalize(torch.autograd.Function):
    """(x - mean) / sqrt(var + eps), or x / sqrt(mean(x^2) + eps) with `rms`, over a
    hidden dimension of `hidden` elements split over the group `row` (normalize)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, row: TensorParallel, hidden: int, rms: bool,
                site: str, fused: bool) -> torch.Tensor:
        xf = x.float()
        if rms:
            var = row.all_reduce(xf.square().sum(-1), site) / hidden
        elif fused:
            mean, square = row.all_reduce(torch.stack([xf.sum(-1), xf.square().sum(-1)]),
                                          site) / hidden
            var, xf = square - mean.square(), xf - mean.unsqueeze(-1)
        else:
            xf = xf - (row.all_reduce(xf.sum(-1), site) / hidden).unsqueeze(-1)
            var = row.all_reduce(xf.square().sum(-1), site) / hidden
        rstd = torch.rsqrt(var + NORM_EPS).unsqueeze(-1)
        normed = xf * rstd
        ctx.save_for_backward(normed, rstd)
        ctx.row, ctx.hidden, ctx.rms, ctx.site, ctx.fused = row, hidden, rms, site, fused
        return normed.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        normed, rstd = ctx.saved_tensors
        row, hidden, site = ctx.row, ctx.hidden, ctx.site
        g = grad.float()
        if ctx.rms:
            dot, mean = row.all_reduce((g * normed).sum(-1), site) / hidden, None
        elif ctx.fused:
            dot, mean = row.all_reduce(torch.stack([(g * normed).sum(-1), g.sum(-1)]),
                                       site) / hidden
        else:
            dot = row.all_reduce((g * normed).sum(-1), site) / hidden
            mean = row.all_reduce(g.sum(-1), site) / hidden
        dx = g - normed * dot.unsqueeze(-1)
        if mean is not None:
            dx = dx - mean.unsqueeze(-1)
        return (dx * rstd).to(grad.dtype), None, None, None, None, None


class GridAttention(Attention):
    """kernels.layers.Attention on the grid: a/q heads (and g/q K/V groups) of samples
    block row; QKV one SUMMA product, the output projection another."""

    def __init__(self, spec: ModelSpec, grid: SummaGrid, recompute: str = "none"):
        nn.Module.__init__(self)  # not Attention's: it builds Megatron's 1D linears
        h, kv, bias = spec.hidden_size, spec.kv_hidden_size, spec.add_bias_linear
        self.grid = grid
        self._init_heads(spec, grid.q, f"q={grid.q}", recompute)
        self.query = GridLinear(h, h, bias, grid)
        self.key = GridLinear(h, kv, bias, grid)
        self.value = GridLinear(h, kv, bias, grid)
        self.proj = GridLinear(h, h, bias, grid)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = grid_linear(x, [self.query, self.key, self.value], self.grid)
        return grid_linear(self.attend(q, k, v), [self.proj], self.grid)[0]


class GridMLP(nn.Module):
    """kernels.layers.MLP on the grid: fc1 (with SwiGLU's gate, one product), fc2."""

    def __init__(self, spec: ModelSpec, grid: SummaGrid):
        super().__init__()
        h, f, bias = spec.hidden_size, spec.ffn_hidden_size, spec.add_bias_linear
        self.swiglu, self.grid = spec.swiglu, grid
        self.fc1 = GridLinear(h, f, bias, grid)
        self.gate = GridLinear(h, f, bias, grid) if spec.swiglu else None
        self.fc2 = GridLinear(f, h, bias, grid)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = grid_linear(x, [self.gate, self.fc1], self.grid)
            hidden = F.silu(gate) * up
        else:
            hidden = F.gelu(grid_linear(x, [self.fc1], self.grid)[0])
        return grid_linear(hidden, [self.fc2], self.grid)[0]


class GridTransformerLayer(TransformerLayer):
    """kernels.layers.TransformerLayer (its forward) of GridNorm, GridAttention, GridMLP."""

    def __init__(self, spec: ModelSpec, grid: SummaGrid, recompute: str = "none"):
        nn.Module.__init__(self)  # not TransformerLayer's: it builds the 1D blocks
        self._assemble(spec, lambda: GridNorm(spec, grid), GridAttention(spec, grid, recompute),
                       GridMLP(spec, grid))

