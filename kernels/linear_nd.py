"""Linear layers Y = X W on Colossal-AI's 3D and 2.5D tensor-parallel grids, with autograd,
on real process groups (docs/research/tensor_parallel_nd.md sections 1.2, 1.3, 3 and 4;
grids and group names as schedules.tp_grid lays them out).

3D (Bian et al. 2021; Colossal-AI's legacy parallel_3d/_operation.py `_Linear3D`,
parallel_3d/layers.py `Linear3D`, initializer_3d.py): tp = q^3, tensor rank
t = i + q j + q^2 k; 'tp_weight' varies i, 'tp_input' j, 'tp_output' k. A linear gathers
over its input group and scatters over its output group: ('tp_input', 'tp_output'), or
the other way round with `swapped` (Colossal-AI's swap_in_out_group after each Linear3D),
so two consecutive linears chain (QKV then projection, fc1 then fc2). With c[a] this
rank's coordinate on axis a, `gather`/`scatter` the linear's input/output groups:
- X: batch block i q + c[gather] of q^2 (dim 0: Colossal-AI splits the micro-batch, not
  the tokens), hidden block c[scatter] of q;
- W (h_in x h_out): row block c[scatter] q + i of q^2, column block c[gather] of q;
- forward: all-gather X over `gather` (batch dim) and W over 'tp_weight' (dim 0), one
  local (b/q, ..., h_in/q) @ (h_in/q, h_out/q) GEMM, reduce-scatter Y over `scatter`
  (batch dim). Y's block, batch i q + c[scatter], hidden c[gather], is the input layout
  of the swapped linear;
- backward: all-gather dY over `scatter`, reduce-scatter dX over `gather` and dW over
  'tp_weight'.
`linear_3d` puts kernels.tensor_parallel's differentiable gather and scatter around a
torch matmul, so autograd runs exactly _Linear3D's six collectives, and the matmul keeps
the gathered X and W for the backward as _Linear3D does (section 3). The weight's path
(W's gather, the matmul's weight side) is its own autograd nodes: a zero-bubble split
(kernels.split_backward) runs the dY all-gather and the dX reduce-scatter in I and only
the dW reduce-scatter in W, as schedules.tp_3d charges them.

2.5D (Tesseract, Wang et al. 2021; Colossal-AI's parallel_2p5d/_operation.py
Matmul_AB_2p5D, initializer_2p5d.py): tp = d q^2, t = col + q row + q^2 dep; 'tp_row' and
'tp_col' are the rows and columns of one depth slice, 'tp_dep' the d ranks of one
(row, col). Each slice is a q x q SUMMA grid (kernels.summa) on its 1/d of the
micro-batch: X batch block dep q + row of d q, hidden block col; W block (row, col), the
same on every slice. `linear_25d` is one SUMMA product on the slice; after the backward,
`sum_over_depth` all-reduces each weight gradient over 'tp_dep', as data parallelism sums
its replicas' (the paper's layout; Colossal-AI's current code feeds every slice the same
samples and never sums: section 1.2).

gloo has no reduce-scatter: kernels.tensor_parallel runs it as an all-reduce and a slice
and records the logical REDUCE_SCATTER. Every collective is recorded on the grid's one
list (kernels.tensor_parallel.CollectiveRecord: kind, nccl-tests bytes, site, clock
markers, group axis). Biases are not modelled here. Blocks are kernels.layers'
((dim, index, parts), ...); dim -1 is an activation's hidden dimension.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from clustersim.schedules.names import (TP_COL, TP_DEP, TP_INPUT, TP_INPUT_WEIGHT, TP_OUTPUT,
                                        TP_OUTPUT_WEIGHT, TP_ROW, TP_WEIGHT)
from clustersim.schedules.tp_grid import TpGrid

from .summa import SummaGrid, summa_matmul
from .tensor_parallel import TensorParallel

AXES_3D = (TP_WEIGHT, TP_INPUT, TP_OUTPUT)  # coordinates i, j, k
AXES_25D = (TP_ROW, TP_COL, TP_DEP)
Blocks = tuple[tuple[int, int, int], ...]


def world_groups(grid: TpGrid, axes: Iterable[str], timeout: Any = None) -> dict[str, Any]:
    """This process's group on each of `axes` in a world of exactly the grid's tp
    processes (tensor rank = global rank): every process creates every group of every
    axis, in the same order, as torch.distributed.new_group requires."""
    size = math.prod(grid.sizes)
    if dist.get_world_size() != size:
        raise ValueError(f"a {grid.mode} grid of {size} ranks needs {size} processes, the "
                         f"world has {dist.get_world_size()}")
    rank, kw = dist.get_rank(), {} if timeout is None else {"timeout": timeout}
    mine: dict[str, Any] = {}
    for axis in axes:
        made: list[list[int]] = []
        for t in range(size):
            members = grid.members(axis, t)
            if members not in made:
                made.append(members)
                group = dist.new_group(members, **kw)
                if rank in members:
                    mine[axis] = group
    return mine


def linear_roles(swapped: bool) -> tuple[str, str]:
    """A 3D linear's (input, output) groups (module docstring)."""
    return (TP_OUTPUT, TP_INPUT) if swapped else (TP_INPUT, TP_OUTPUT)


@dataclass(eq=False)
class Grid3D:
    """Tensor rank `rank` of a q x q x q grid: its groups on 'tp_weight', 'tp_input' and
    'tp_output' (members i, j, k) and, where given, the planes 'tp_input_weight' and
    'tp_output_weight' (member i + q j, i + q k), all recording into one list."""

    q: int
    rank: int
    axes: dict[str, TensorParallel]
    sequence_parallel: bool = False  # the grid splits activations already

    @classmethod
    def of_groups(cls, q: int, rank: int, groups: Mapping[str, Any], clock: Any = None
                  ) -> Grid3D:
        """The grid of tensor rank `rank` on its process groups ({axis: group})."""
        if q < 2 or not 0 <= rank < q ** 3:
            raise ValueError(f"tensor rank {rank} is not on a {q} x {q} x {q} grid (q >= 2)")
        first = TensorParallel(q, rank % q, groups[TP_WEIGHT], axis=TP_WEIGHT,
                               **({} if clock is None else {"clock": clock}))
        axes = {TP_WEIGHT: first}
        for axis, coord in ((TP_INPUT, rank // q % q), (TP_OUTPUT, rank // q ** 2)):
            axes[axis] = TensorParallel(q, coord, groups[axis], clock=first.clock,
                                        records=first.records, axis=axis)
        cube = TpGrid("3d", q)
        for plane in (TP_INPUT_WEIGHT, TP_OUTPUT_WEIGHT):
            if plane in groups:
                axes[plane] = TensorParallel(q * q, cube.members(plane, rank).index(rank),
                                             groups[plane], clock=first.clock,
                                             records=first.records, axis=plane)
        return cls(q, rank, axes)

    def coord(self, axis: str) -> int:
        return self.axes[axis].rank

    def take_records(self) -> list:
        """The collectives of all three groups since the last call, in the order they ran."""
        return self.axes[TP_WEIGHT].take_records()

    def input_blocks(self, swapped: bool = False) -> Blocks:
        """The block of its input X a linear (`swapped` or not) takes on this rank; the
        output's is the swapped linear's input block."""
        gather, scatter = linear_roles(swapped)
        q, i = self.q, self.coord(TP_WEIGHT)
        return (0, i * q + self.coord(gather), q * q), (-1, self.coord(scatter), q)

    def weight_blocks(self, swapped: bool = False) -> Blocks:
        """The block of a linear's W (h_in x h_out) this rank holds."""
        gather, scatter = linear_roles(swapped)
        q, i = self.q, self.coord(TP_WEIGHT)
        return (0, self.coord(scatter) * q + i, q * q), (1, self.coord(gather), q)

    @property
    def sample_block(self) -> tuple[int, int]:
        """(index, parts) of the micro-batch's samples the unswapped linears' input block
        holds (the layers' activations): block i q + j of q^2."""
        return self.coord(TP_WEIGHT) * self.q + self.coord(TP_INPUT), self.q * self.q

    def activation_shape(self, batch: int, seq: int, hidden: int) -> tuple[int, int, int]:
        return batch // self.q ** 2, seq, hidden // self.q


def linear_3d(x: torch.Tensor, w: torch.Tensor, grid: Grid3D, swapped: bool = False,
              site: str = "layer") -> torch.Tensor:
    """This rank's block of X W (module docstring): `x` (batch, ..., h_in/q) its
    input_blocks, `w` (h_in/q^2, h_out/q) its weight_blocks; differentiable in both."""
    gather, scatter = linear_roles(swapped)
    x_rows = grid.axes[gather].gather(x, site, 0)
    w_rows = grid.axes[TP_WEIGHT].gather(w, site, 0)
    return grid.axes[scatter].scatter(torch.matmul(x_rows, w_rows), site, 0)


@dataclass(eq=False)
class Grid25D(SummaGrid):
    """Tensor rank `rank` of d q x q grids: its slice's SUMMA grid ('tp_row', 'tp_col';
    row and col as on a 2D grid) and its depth group `dep` ('tp_dep', member dep), all
    recording into one list."""

    depth: int = 2
    dep: TensorParallel | None = None

    @classmethod
    def of_groups(cls, q: int, depth: int, rank: int, groups: Mapping[str, Any],
                  clock: Any = None) -> Grid25D:
        """The grid of tensor rank `rank` on its process groups ({axis: group})."""
        if depth < 2 or not 0 <= rank < depth * q * q:
            raise ValueError(f"tensor rank {rank} is not on {depth} grids of {q} x {q} "
                             f"(depth >= 2)")
        plane = SummaGrid.of_groups(q, rank % (q * q), groups[TP_ROW], groups[TP_COL], clock)
        first = plane.row_group
        return cls(q, rank, first, plane.col_group, depth=depth, dep=TensorParallel(
            depth, rank // (q * q), groups[TP_DEP], clock=first.clock, records=first.records,
            axis=TP_DEP))

    @property
    def sample_block(self) -> tuple[int, int]:
        """Samples block dep q + row of d q (the slice's dep, then the row within it)."""
        return self.dep.rank * self.q + self.row, self.depth * self.q

    @property
    def slice_block(self) -> tuple[int, int]:
        """The depth slice's samples: block dep of d."""
        return self.dep.rank, self.depth

    def input_blocks(self) -> Blocks:
        """The block of an activation this rank holds (every linear's input and output)."""
        return (0, *self.sample_block), (-1, self.col, self.q)

    def weight_blocks(self) -> Blocks:
        """The block of a W (h_in x h_out) this rank holds, the same on every slice."""
        return (0, self.row, self.q), (1, self.col, self.q)


def linear_25d(x: torch.Tensor, w: torch.Tensor, grid: Grid25D, site: str = "layer"
               ) -> torch.Tensor:
    """This rank's block of X W: one SUMMA product on its depth slice (kernels.summa)."""
    return summa_matmul(x, w, grid, site)


@torch.no_grad()
def sum_over_depth(params: Iterable[torch.Tensor], grid: Grid25D, site: str = "dep_grad"
                   ) -> None:
    """Each parameter's .grad summed over 'tp_dep' in place: one all-reduce per weight
    (h_in h_out / q^2 elements), the data-parallel sum of the depth replicas (research
    note section 1.2, 'grad sync'). Every rank passes the same parameters."""
    for p in params:
        if p.grad is not None:
            p.grad.copy_(grid.dep.all_reduce(p.grad, site))
