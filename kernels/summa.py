"""The 2D tensor-parallel grid of one rank and SUMMA matrix products on it, with autograd.

Optimus (Xu et al. 2021, "An Efficient 2D Method for Training Super-Large Deep Learning
Models") as Colossal-AI runs it (`tp_mode='2d'`; docs/research/tensor_parallel_nd.md
sections 1.1 and 6.1, Colossal-AI's legacy initializer_2d.py and parallel_2d/_operation.py):
tp = q^2 ranks, tensor rank t at (row, col) = divmod(t, q). Group 'tp_row' holds the q
ranks of this rank's row (consecutive t; this rank is its member `col`), 'tp_col' those
of its column (stride q; member `row`), as schedules.tp_grid lays them out. A matrix
A (m x n) is cut in q x q blocks; rank (i, j) holds A_ij (m/q x n/q).

The products run q steps l = 0..q-1 each:
- `summa_ab`, C = A B (Matmul_AB_2D): broadcast A_il over the row from (i, l) and B_lj
  over the column from (l, j); C_ij += A_il B_lj.
- `summa_abt`, C = A B^T (Matmul_ABT_2D): broadcast B_lj over the column from (l, j);
  A_ij B_lj^T is this rank's part of C_il, reduced over the row to (i, l).
- `summa_atb`, C = A^T B (Matmul_ATB_2D): broadcast A_il over the row from (i, l);
  A_il^T B_ij is this rank's part of C_lj, reduced over the column to (l, j).
`summa_matmul(x, w, grid)` is Y = X W (or X W^T, the output layer's) with autograd: the
forward is `ab` (`abt`), the input gradient dX = dY W^T (dY W) is `abt` (`ab`) and the
weight gradient dW = X^T dY (dY^T X) is `atb`. The two gradients are two autograd nodes,
so a zero-bubble split (kernels.split_backward: I, then W) runs each gradient's GEMMs
and collectives once, in its own op, as schedules.tp_2d charges them.

Per product the payloads (elements) are the block sizes: forward q broadcasts of
T h_in/q^2 over the row and q of h_in h_out/q^2 over the column; backward q broadcasts
(column) and q reduces (row) for dX, q broadcasts (row) and q reduces (column) for dW.
Collectives run blocking, step after step (Colossal-AI double-buffers them
asynchronously), each recorded on its group (kernels.tensor_parallel: kind BROADCAST or
REDUCE, nccl-tests bytes = the block), steps 2..q marked `alongside` as the IR places
them (schedules.tp_2d.summa_placements). Units: elements of the operands' dtype; bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from clustersim.schedules.names import TP_COL, TP_ROW

from .tensor_parallel import TensorParallel


@dataclass(eq=False)
class SummaGrid:
    """Tensor rank `rank` of a q x q grid: its row group (`row_group`, axis 'tp_row', this
    rank = member `col`) and column group (`col_group`, 'tp_col', member `row`), which
    record into one list."""

    q: int
    rank: int
    row_group: TensorParallel
    col_group: TensorParallel
    sequence_parallel: bool = False  # the grid splits activations already

    @classmethod
    def of_groups(cls, q: int, rank: int, row_group: Any, col_group: Any,
                  clock: Any = None) -> SummaGrid:
        """The grid of tensor rank `rank` on the process groups of its row and column."""
        if q < 2 or not 0 <= rank < q * q:
            raise ValueError(f"tensor rank {rank} is not on a {q} x {q} grid (q >= 2)")
        row, col = divmod(rank, q)
        along_row = TensorParallel(q, col, row_group, records=[], axis=TP_ROW,
                                   **({} if clock is None else {"clock": clock}))
        return cls(q, rank, along_row, TensorParallel(q, row, col_group, clock=along_row.clock,
                                                      records=along_row.records, axis=TP_COL))

    @property
    def row(self) -> int:
        return self.rank // self.q % self.q  # (2.5D: the rank's depth slice's row)

    @property
    def col(self) -> int:
        return self.rank % self.q

    @property
    def size(self) -> int:
        return self.q * self.q

    def take_records(self) -> list:
        """Both groups' collectives since the last call, in the order they ran."""
        return self.row_group.take_records()

    depth = 1  # grids of the micro-batch (kernels.linear_nd.Grid25D: d)

    @property
    def sample_block(self) -> tuple[int, int]:
        """(index, parts) of the micro-batch's samples this rank's activation block holds:
        block `row` of q."""
        return self.row, self.q

    @property
    def slice_block(self) -> tuple[int, int]:
        """(index, parts) of the micro-batch's samples this rank's grid works on: all."""
        return 0, 1

    def activation_shape(self, batch: int, seq: int, hidden: int) -> tuple[int, int, int]:
        """This rank's block of a (batch, seq, hidden) activation: samples over rows,
        hidden over columns."""
        return batch // self.sample_block[1], seq, hidden // self.q


def sample_rows(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Samples block (index, parts) of `x` along dim 0 (a grid's sample_block or
    slice_block)."""
    index, parts = block
    rows = x.shape[0] // parts
    return x[index * rows:(index + 1) * rows]


def world_grid(q: int, clock: Any = None, timeout: Any = None) -> SummaGrid:
    """The grid of a world of exactly q^2 processes (tensor rank = global rank): every
    process creates every row group, then every column group, in that order, as
    torch.distributed.new_group requires."""
    if dist.get_world_size() != q * q:
        raise ValueError(f"a {q} x {q} grid needs {q * q} processes, the world has "
                         f"{dist.get_world_size()}")
    rank, kw = dist.get_rank(), {} if timeout is None else {"timeout": timeout}
    rows = [dist.new_group([i * q + j for j in range(q)], **kw) for i in range(q)]
    cols = [dist.new_group([i * q + j for i in range(q)], **kw) for j in range(q)]
    return SummaGrid.of_groups(q, rank, rows[rank // q], cols[rank % q], clock)


def summa_ab(grid: SummaGrid, a: torch.Tensor, b: torch.Tensor, site: str) -> torch.Tensor:
    """Block (row, col) of A B from blocks A_ij (m/q x k/q) and B_ij (k/q x n/q)."""
    out = None
    for step in range(grid.q):
        a_l = grid.row_group.broadcast(a, step, site, step > 0)
        b_l = grid.col_group.broadcast(b, step, site, step > 0)
        out = a_l @ b_l if out is None else torch.addmm(out, a_l, b_l)
    return out


def summa_abt(grid: SummaGrid, a: torch.Tensor, b: torch.Tensor, site: str) -> torch.Tensor:
    """Block (row, col) of A B^T from blocks A_ij (m/q x k/q) and B_ij (n/q x k/q)."""
    mine = None
    for step in range(grid.q):
        b_l = grid.col_group.broadcast(b, step, site, step > 0)
        part = grid.row_group.reduce(a @ b_l.t(), step, site, step > 0)
        mine = part if part is not None else mine
    return mine


def summa_atb(grid: SummaGrid, a: torch.Tensor, b: torch.Tensor, site: str) -> torch.Tensor:
    """Block (row, col) of A^T B from blocks A_ij (m/q x k/q) and B_ij (m/q x n/q)."""
    mine = None
    for step in range(grid.q):
        a_l = grid.row_group.broadcast(a, step, site, step > 0)
        part = grid.col_group.reduce(a_l.t() @ b, step, site, step > 0)
        mine = part if part is not None else mine
    return mine


def summa_matmul(x: torch.Tensor, w: torch.Tensor, grid: SummaGrid, site: str = "layer",
                 transposed: bool = False) -> torch.Tensor:
    """This rank's block of X W, or of X W^T with `transposed`, differentiable in `x` and
    `w` (module docstring). `x` is (..., k/q), its leading dims the rows of its block;
    `w` is (k/q, n/q), or (n/q, k/q) when transposed."""
    rows = x.reshape(-1, x.shape[-1])
    y = _InputPath.apply(rows, w.detach(), grid, site, transposed)
    if w.requires_grad:
        y = y + _WeightPath.apply(rows.detach(), w, grid, site, transposed, y.shape)
    return y.reshape(*x.shape[:-1], y.shape[-1])


class _InputPath(torch.autograd.Function):
    """The product forward, and the input gradient only."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, grid: SummaGrid, site: str,
                transposed: bool) -> torch.Tensor:
        ctx.save_for_backward(w)
        ctx.grid, ctx.site, ctx.transposed = grid, site, transposed
        return (summa_abt if transposed else summa_ab)(grid, x, w, site)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        (w,) = ctx.saved_tensors
        product = summa_ab if ctx.transposed else summa_abt
        return product(ctx.grid, dy.contiguous(), w, ctx.site), None, None, None, None


class _WeightPath(torch.autograd.Function):
    """Zeros forward (added to the product), the weight gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, grid: SummaGrid, site: str,
                transposed: bool, shape: torch.Size) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.grid, ctx.site, ctx.transposed = grid, site, transposed
        return w.new_zeros(()).expand(shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        (x,) = ctx.saved_tensors
        dy = dy.contiguous()
        dw = (summa_atb(ctx.grid, dy, x, ctx.site) if ctx.transposed
              else summa_atb(ctx.grid, x, dy, ctx.site))
        return None, dw, None, None, None, None

