"""The transformer layer of kernels.layers on a 3D tensor-parallel grid (Bian et al. 2021;
Colossal-AI's legacy parallel_3d/layers.py LayerNorm3D and Linear3D:
docs/research/tensor_parallel_nd.md sections 1.3 and 6.3), on kernels.linear_nd.Grid3D
(tensor rank t = i + q j + q^2 k; 'tp_weight' varies i, 'tp_input' j, 'tp_output' k).

A layer's input and output are samples block i q + j of q^2 (b/q^2 of the micro-batch) by
hidden block k of q (Grid3D.sample_block). Inside it:
- linears (kernels.linear_nd.linear_3d): QKV (one product) and fc1 (with SwiGLU's gate:
  one product) gather over 'tp_input' and scatter over 'tp_output'; the projection and
  fc2 the other way round (`swapped`, Colossal-AI's swap_in_out_group). So attention and
  the activation function run on the QKV / fc1 output block, samples i q + k by hidden
  block j: a/q heads (g/q K/V groups), f/q FFN columns. A weight A (out x in; torch's
  layout, y = x A^T) is held as the transpose of its block of W = A^T
  (Grid3D.weight_blocks); a product's weights are concatenated along their outputs, so
  output block j holds block j of each (as kernels.layers_2d does);
- a bias (h_out) is held as the product's output hidden block (its gather coordinate, of
  q), replicated on the plane of 'tp_weight' and its scatter group ('tp_output_weight'
  for QKV and fc1, 'tp_input_weight' for the projection and fc2): added locally, its
  gradient all-reduced over that plane (h_out/q; one per product);
- LayerNorm / RMSNorm (LayerNorm3D): per-token statistics all-reduced over 'tp_output'
  (the hidden split), once forward and once backward, LayerNorm's two sums stacked
  (2 T/q^2 fp32 values; RMSNorm T/q^2: kernels.layers_2d.normalize, fused), the weights
  hidden block k of q, replicated on 'tp_input_weight', their gradients all-reduced there
  (one per weight vector).
The gradients that only parameters need (W's all-gather backward, the bias and norm
all-reduces) are on the parameters' own autograd path, so a zero-bubble split
(kernels.split_backward) runs them in W, as schedules.tp_3d charges them. Units: elements
of the model dtype, statistics fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clustersim.schedules.model import ModelSpec
from clustersim.schedules.names import TP_INPUT_WEIGHT, TP_OUTPUT, TP_OUTPUT_WEIGHT

from .layers import Attention, TransformerLayer, block_parameter
from .layers_2d import normalize
from .linear_nd import Grid3D, linear_3d, linear_roles

_BIAS_PLANE = {False: TP_OUTPUT_WEIGHT, True: TP_INPUT_WEIGHT}  # by `swapped` (docstring)


def cube_vector(full_shape: tuple[int, ...], init: str, grid: Grid3D, axis: str
                ) -> nn.Parameter:
    """Block coord(axis) of q along the last dim of a vector (or a table's columns)."""
    return block_parameter(full_shape, init, ((len(full_shape) - 1, grid.coord(axis), grid.q),))


class CubeLinear(nn.Module):
    """One linear's weight block (the transpose of its W block: module docstring) and
    bias block on this rank; `cube_linear` computes with one or several of them."""

    def __init__(self, in_features: int, out_features: int, bias: bool, grid: Grid3D,
                 swapped: bool):
        super().__init__()
        (_, rows, row_parts), (_, cols, col_parts) = grid.weight_blocks(swapped)
        self.weight = block_parameter((out_features, in_features), "normal",
                                      ((0, cols, col_parts), (1, rows, row_parts)))
        gather = linear_roles(swapped)[0]
        self.bias = cube_vector((out_features,), "zeros", grid, gather) if bias else None


def cube_linear(x: torch.Tensor, linears: list[CubeLinear], grid: Grid3D, swapped: bool,
                site: str = "layer") -> tuple[torch.Tensor, ...]:
    """Each linear's output block for input block `x`: one 3D product of their
    concatenated weights, plus their biases (module docstring)."""
    y = linear_3d(x, torch.cat([lin.weight for lin in linears]).t(), grid, swapped, site)
    if linears[0].bias is not None:
        bias = torch.cat([lin.bias for lin in linears])
        y = y + grid.axes[_BIAS_PLANE[swapped]].enter(bias, site)
    return y.split([lin.weight.shape[0] for lin in linears], dim=-1)


class CubeNorm(nn.Module):
    """LayerNorm (weight, bias) or RMSNorm (weight) of the layers' activation blocks, eps
    1e-5 (module docstring)."""

    def __init__(self, spec: ModelSpec, grid: Grid3D, site: str = "layer"):
        super().__init__()
        h = self.hidden = spec.hidden_size
        self.grid, self.site, self.rms = grid, site, spec.normalization == "RMSNorm"
        self.weight = cube_vector((h,), "ones", grid, TP_OUTPUT)
        self.bias = None if self.rms else cube_vector((h,), "zeros", grid, TP_OUTPUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plane = self.grid.axes[TP_INPUT_WEIGHT]
        x = normalize(x, self.grid.axes[TP_OUTPUT], self.hidden, self.rms, self.site, True)
        x = x * plane.enter(self.weight, self.site)
        return x if self.bias is None else x + plane.enter(self.bias, self.site)


class CubeAttention(Attention):
    """kernels.layers.Attention on the cube: QKV one product, the projection a swapped
    one; a/q heads (and g/q K/V groups) of samples block i q + k."""

    def __init__(self, spec: ModelSpec, grid: Grid3D, recompute: str = "none"):
        nn.Module.__init__(self)  # not Attention's: it builds Megatron's 1D linears
        h, kv, bias = spec.hidden_size, spec.kv_hidden_size, spec.add_bias_linear
        self.grid = grid
        self._init_heads(spec, grid.q, f"q={grid.q}", recompute)
        self.query = CubeLinear(h, h, bias, grid, False)
        self.key = CubeLinear(h, kv, bias, grid, False)
        self.value = CubeLinear(h, kv, bias, grid, False)
        self.proj = CubeLinear(h, h, bias, grid, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = cube_linear(x, [self.query, self.key, self.value], self.grid, False)
        return cube_linear(self.attend(q, k, v), [self.proj], self.grid, True)[0]


class CubeMLP(nn.Module):
    """kernels.layers.MLP on the cube: fc1 (with SwiGLU's gate, one product), fc2
    swapped."""

    def __init__(self, spec: ModelSpec, grid: Grid3D):
        super().__init__()
        h, f, bias = spec.hidden_size, spec.ffn_hidden_size, spec.add_bias_linear
        self.swiglu, self.grid = spec.swiglu, grid
        self.fc1 = CubeLinear(h, f, bias, grid, False)
        self.gate = CubeLinear(h, f, bias, grid, False) if spec.swiglu else None
        self.fc2 = CubeLinear(f, h, bias, grid, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = cube_linear(x, [self.gate, self.fc1], self.grid, False)
            hidden = F.silu(gate) * up
        else:
            hidden = F.gelu(cube_linear(x, [self.fc1], self.grid, False)[0])
        return cube_linear(hidden, [self.fc2], self.grid, True)[0]


class CubeTransformerLayer(TransformerLayer):
    """kernels.layers.TransformerLayer (its forward) of CubeNorm, CubeAttention, CubeMLP."""

    def __init__(self, spec: ModelSpec, grid: Grid3D, recompute: str = "none"):
        nn.Module.__init__(self)  # not TransformerLayer's: it builds the 1D blocks
        self._assemble(spec, lambda: CubeNorm(spec, grid), CubeAttention(spec, grid, recompute),
                       CubeMLP(spec, grid))
