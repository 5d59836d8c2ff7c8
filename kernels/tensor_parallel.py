"""Tensor- and sequence-parallel communication of one rank, as autograd functions.

Megatron-LM's conjugate functions (Shoeybi et al. 2019, "Megatron-LM", section 3, the
`f` and `g` operators), on this rank's TP process group:
- `enter` before the column-parallel linears of a block: copy-to-TP-region, identity in
  the forward and all-reduce of the gradient in the backward (`f`);
- `exit` after a row-parallel linear: reduce-from-TP-region, all-reduce in the forward
  and identity in the backward (`g`).
With sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models", section 4.2.2) the activations between blocks (LayerNorm,
dropout, residual) are split along the sequence, and the pair becomes
- `enter`: all-gather along the sequence in the forward, reduce-scatter of the gradient
  in the backward (`g` of the paper);
- `exit`: reduce-scatter along the sequence in the forward, all-gather in the backward
  (`g-bar`).
Either way a layer moves 2 collectives of b*s*h elements in the forward and 2 in the
backward: 4 all-reduces (ring volume 2(t-1)/t each) = 8*b*s*h*(t-1)/t per device, or
4 all-gathers + 4 reduce-scatters ((t-1)/t each), the same volume.

A replicated parameter used on a sequence shard (LayerNorm / RMSNorm weights, a
row-parallel bias, the position embedding: `replicated_in_sequence` marks them) gets only
its shard's part of the gradient; Megatron all-reduces those gradients over TP once per
iteration (finalize_model_grads). Here each op that accumulates weight gradients (B, W)
does it for what it added (`SequenceGradients`: one coalesced all-reduce, site
'sp_grad'), so a gradient is whole before any DP/ZeRO op reads it, in every schedule, at
the price of one small all-reduce per weight-gradient op instead of one per iteration.

gloo has no reduce-scatter: it runs as an all-reduce of the whole tensor and a slice (one
code path on NCCL too, as kernels.dp_ops); records still say REDUCE_SCATTER and its
logical size. Activations are batch-first (b, s, h): the sequence is dim 1.

Every collective is recorded (`records`: kind, group axis, bytes, site, start and end
clock markers) so the executor can lay TP ops out on their group's lane; bytes follow
nccl-tests: an all-reduce, reduce-scatter, broadcast or reduce the input tensor, an
all-gather the gathered output. The broadcast and reduce (rooted at a rank of the group)
serve the 2D grid's SUMMA products (kernels.summa), whose groups are the grid's rows and
columns (`axis` 'tp_row', 'tp_col'). Units: bytes, clock markers (kernels.timing).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from clustersim.schedules.names import TP
from clustersim.schedules.ops import OpKind

SEQUENCE_DIM = 1


@dataclass(frozen=True)
class CollectiveRecord:
    """One TP collective that ran: kind, logical bytes, where in the model (site: 'layer',
    'embedding', 'head', 'loss', 'sp_grad'), clock markers around the blocking call, the
    group axis it ran on, and whether the IR places it beside its compute op (`alongside`:
    a SUMMA step after the first, schedules.tp_2d.summa_placements)."""

    kind: OpKind
    nbytes: int
    site: str
    start: Any
    end: Any
    group: str = TP
    alongside: bool = False


class _PerfClock:
    def mark(self) -> float:
        return time.perf_counter()


@dataclass(eq=False)
class TensorParallel:
    """This rank's place in its TP group: `size` ranks, this one `rank`, the process
    `group` (None only at size 1), `sequence_parallel`, the `clock` that times each
    collective (kernels.timing; perf_counter by default), the list its collectives are
    recorded in (several groups of one rank may share one) and the group's `axis` name."""

    size: int = 1
    rank: int = 0
    group: Any = None
    sequence_parallel: bool = False
    clock: Any = field(default_factory=_PerfClock)
    records: list[CollectiveRecord] = field(default_factory=list)
    axis: str = TP

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tp rank {self.rank} out of range 0..{self.size - 1}")
        if self.size == 1:
            self.sequence_parallel = False  # one rank: nothing to split

    @property
    def active(self) -> bool:
        return self.size > 1

    # --- the conjugate functions -----------------------------------------------------
    def enter(self, x: torch.Tensor, site: str = "layer") -> torch.Tensor:
        """Input of column-parallel linears: `f` (copy), or the SP all-gather."""
        if not self.active:
            return x
        if self.sequence_parallel:
            return self.gather(x, site, SEQUENCE_DIM)
        return _CopyToRegion.apply(x, self, site)

    def exit(self, x: torch.Tensor, site: str = "layer") -> torch.Tensor:
        """Output of a row-parallel linear (partial sums): `g` (all-reduce), or the SP
        reduce-scatter."""
        if not self.active:
            return x
        if self.sequence_parallel:
            return self.scatter(x, site, SEQUENCE_DIM)
        return _ReduceFromRegion.apply(x, self, site)

    def gather(self, x: torch.Tensor, site: str, dim: int) -> torch.Tensor:
        """The group's shards of `x` concatenated along `dim`, differentiably: all-gather
        forward, reduce-scatter of the gradient backward."""
        return _Gather.apply(x, self, site, dim)

    def scatter(self, x: torch.Tensor, site: str, dim: int) -> torch.Tensor:
        """This rank's shard along `dim` of the sum of `x` over the group, differentiably:
        reduce-scatter forward, all-gather of the gradient backward."""
        return _Scatter.apply(x, self, site, dim)

    def activation_shape(self, batch: int, seq: int, hidden: int) -> tuple[int, int, int]:
        """The part of a (batch, seq, hidden) activation this rank holds between layers
        and stages: the sequence shard with SP, else all of it."""
        return batch, seq // (self.size if self.sequence_parallel else 1), hidden

    def sequence_slice(self, length: int) -> slice:
        """This rank's positions of a `length`-token sequence (all of them without SP)."""
        if not self.sequence_parallel:
            return slice(0, length)
        part = length // self.size
        return slice(self.rank * part, (self.rank + 1) * part)

    def take_records(self) -> list[CollectiveRecord]:
        """The collectives recorded since the last call (and forget them; in place, so a
        shared list stays shared)."""
        out = list(self.records)
        self.records.clear()
        return out

    # --- collectives (blocking, recorded) ---------------------------------------------
    def all_reduce(self, x: torch.Tensor, site: str,
                   op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
        """Sum (or `op`) of `x` over the group, in a new contiguous tensor."""
        out = x.contiguous().clone()
        start = self.clock.mark()
        dist.all_reduce(out, op=op, group=self.group)
        self._record(OpKind.ALL_REDUCE, out, site, start)
        return out

    def all_gather(self, x: torch.Tensor, site: str, dim: int = SEQUENCE_DIM) -> torch.Tensor:
        """The group's shards of `x` concatenated along `dim` (the sequence by default)."""
        mine = x.contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.size)]
        start = self.clock.mark()
        dist.all_gather(parts, mine, group=self.group)
        out = torch.cat(parts, dim=dim)
        self._record(OpKind.ALL_GATHER, out, site, start)
        return out

    def reduce_scatter(self, x: torch.Tensor, site: str, dim: int = SEQUENCE_DIM
                       ) -> torch.Tensor:
        """This rank's shard along `dim` (the sequence by default) of the sum of `x` over
        the group (all-reduce + slice: gloo has no reduce-scatter)."""
        full = x.contiguous().clone()
        start = self.clock.mark()
        dist.all_reduce(full, group=self.group)
        self._record(OpKind.REDUCE_SCATTER, full, site, start)
        part = full.shape[dim] // self.size  # a tensor of its own, not a view of `full`
        return full.narrow(dim, self.rank * part, part).clone(
            memory_format=torch.contiguous_format)

    def broadcast(self, x: torch.Tensor, src: int, site: str, alongside: bool = False
                  ) -> torch.Tensor:
        """Group rank `src`'s `x` (every rank passes a tensor of its shape): `x` itself on
        `src`, a received copy elsewhere."""
        x = x.contiguous()
        buffer = x if self.rank == src else torch.empty_like(x)
        start = self.clock.mark()
        dist.broadcast(buffer, group=self.group, group_src=src)
        self._record(OpKind.BROADCAST, buffer, site, start, alongside)
        return buffer

    def reduce(self, x: torch.Tensor, dst: int, site: str, alongside: bool = False
               ) -> torch.Tensor | None:
        """The sum of `x` over the group on group rank `dst`; None elsewhere."""
        buffer = x.contiguous().clone()
        start = self.clock.mark()
        dist.reduce(buffer, group=self.group, group_dst=dst)
        self._record(OpKind.REDUCE, buffer, site, start, alongside)
        return buffer if self.rank == dst else None

    def _record(self, kind: OpKind, tensor: torch.Tensor, site: str, start: Any,
                alongside: bool = False) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        self.records.append(CollectiveRecord(kind, nbytes, site, start, self.clock.mark(),
                                             self.axis, alongside))


def replicated_in_sequence(p: torch.nn.Parameter | None) -> torch.nn.Parameter | None:
    """Mark a replicated parameter that SP applies to sequence shards (module docstring)."""
    if p is not None:
        p.replicated_in_sequence = True
    return p


class SequenceGradients:
    """Sums over TP what one weight-gradient op adds to the `.grad` of the SP-replicated
    parameters among `params`: `stash()` before the op sets their .grad aside (so the op
    accumulates only its own part, exactly), `reduce()` after it all-reduces those parts
    in one flat tensor and adds the sum back. Every TP rank runs the same op on the same
    parameters, so the collectives match. A no-op without sequence parallelism."""

    def __init__(self, tp: TensorParallel, params: list[torch.nn.Parameter]):
        self.tp = tp
        self.params = [p for p in params if getattr(p, "replicated_in_sequence", False)
                       and p.requires_grad] if tp.sequence_parallel else []
        self.kept: list[torch.Tensor | None] = []

    def stash(self) -> None:
        self.kept = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def reduce(self) -> None:
        if not self.params:
            return
        parts = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        summed = self.tp.all_reduce(torch.cat([g.reshape(-1) for g in parts]), "sp_grad")
        offset = 0
        for p, kept in zip(self.params, self.kept):
            part = summed[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            p.grad = part.clone() if kept is None else kept.add_(part)
        self.kept = []


class _CopyToRegion(torch.autograd.Function):
    """f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TensorParallel, site: str) -> torch.Tensor:
        ctx.tp, ctx.site = tp, site
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return ctx.tp.all_reduce(grad, ctx.site), None, None


class _ReduceFromRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TensorParallel, site: str) -> torch.Tensor:
        return tp.all_reduce(x, site)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None, None


class _Gather(torch.autograd.Function):
    """All-gather along a dim forward, reduce-scatter backward (SP's g along the
    sequence)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TensorParallel, site: str, dim: int
                ) -> torch.Tensor:
        ctx.tp, ctx.site, ctx.dim = tp, site, dim
        return tp.all_gather(x, site, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return ctx.tp.reduce_scatter(grad, ctx.site, ctx.dim), None, None, None


class _Scatter(torch.autograd.Function):
    """Reduce-scatter along a dim forward, all-gather backward (SP's g-bar along the
    sequence)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TensorParallel, site: str, dim: int
                ) -> torch.Tensor:
        ctx.tp, ctx.site, ctx.dim = tp, site, dim
        return tp.reduce_scatter(x, site, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return ctx.tp.all_gather(grad, ctx.site, ctx.dim), None, None, None
