"""Data-parallel ops for real: gradient ALL_REDUCE / REDUCE_SCATTER, parameter
ALL_GATHER over 'dp', 'dp_shard' or 'dp_replicate', and OPT_STEP (a mixin of
kernels.executor.RankExecutor, which owns the loop, the spans and the waits).

What each op does to one rank's parameter units (kernels.param_units):
- ALL_REDUCE (DDP): the flat gradients of its range, summed over the group and divided by
  its size (the mean over replicas), written back into `.grad`.
- REDUCE_SCATTER: the gradients of its range leave `.grad` (freed or zeroed) and, reduced
  (mean), only this rank's owned elements are kept, accumulated into the unit's
  gradient shard. gloo has no reduce-scatter: it runs as an all-reduce of the range and a
  slice, on NCCL too (one code path; timings of it are all-reduce timings).
- ALL_REDUCE over another group chained to a reduce-scatter (HSDP): the shard that
  reduce-scatter produced, averaged over the replicas, then accumulated.
- ALL_GATHER: every rank's owned part of the range is gathered into the parameters
  (all_gather of equal, zero-padded pieces: a bucket that is not one ownership bucket
  moves up to N x its size; `info.wire_bytes` says what moved).
- OPT_STEP(s): Adam (kernels.optimizer) on each unit's owned elements: the gradient shard
  (sharded units) or the full `.grad` (replicated units); the updated owned elements are
  written into the parameters. Non-owned elements stay as they were until a gather. With
  tied embeddings on two pipeline ranks, the OPT_STEP of the first and of the last stage
  first sums the word-embedding gradient over the embedding group (kernels.tied_embedding,
  Megatron's embedding all-reduce; outside the step's span).
- ZeRO-3 reshard: after the last compute op that uses a gather (the rule sim.engine's
  memory follows), a unit sharded at rest is resharded: its non-owned elements become NaN,
  and a compute op using a unit with such elements raises KernelsError (a missing gather).

Span nbytes follow nccl-tests (as the IR): an all-reduce or reduce-scatter the range's
gradients, an all-gather the gathered range. Units: bytes, elements of the model dtype.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from clustersim.schedules.contract import gather_releases
from clustersim.schedules.names import DP, PP_COPIES
from clustersim.schedules.ops import Op, OpKind

from .errors import KernelsError
from .optimizer import FlatAdam
from .param_units import ParamUnit, build_units, intersect, op_ranges, owned_ranges
from .tied_embedding import AXIS, WORD_EMBEDDING, sum_tied_grad, tied_pipeline_ranks


class DataParallelOps:
    """Mixin: the data-parallel handlers and the parameter units they act on."""

    def _init_data_parallel(self, contract: Any) -> None:
        groups = self.schedule.layer_groups
        self.units = build_units(self.modules, self.program, groups, contract, self._rank_in)
        self.ranges = op_ranges(self.program, self.units, contract)
        self.releases = gather_releases(self.program, contract)
        self._chained = {rs for _, _, rs in self.ranges.values() if rs is not None}
        self._pieces: dict[int, torch.Tensor] = {}
        self._owner = {id(p): u for u in self.units.values() for p in u.params}
        self._uses: dict[tuple, list[ParamUnit]] = {}  # (stage, chunk) -> units at rest
        for unit in self.units.values():
            if unit.sharded_at_rest:
                unit.poison()
        spec = next(iter(self.modules.values())).spec
        ends = {0, self.schedule.num_stages - 1} & set(self.modules)
        tied = tied_pipeline_ranks(self.schedule, spec) and not self.setup.loopback
        self._tied_stages = ends if tied else set()
        self.summed_grads: set[str] = set()  # names whose gradient is summed over copies
        self.single_process = self.setup.single_process

    def _rank_in(self, axis: str) -> tuple[int, int]:
        if self.setup.loopback:
            return 0, 1
        members = self.setup.group_ranks.get(axis)
        if members is None:
            raise KernelsError(f"no process group for axis {axis!r} (fsdp='hybrid' needs "
                               f"shard_size for 'dp_shard' / 'dp_replicate')")
        return members.index(self.setup.rank), len(members)

    def _start_dp_iteration(self) -> None:
        for unit in self.units.values():
            unit.grad_shard = None
        self._pieces = {}

    # --- before and after compute ---------------------------------------------------
    def _check_gathered(self, op: Op) -> None:
        """Raise when `op` would compute with resharded (NaN) parameters."""
        key = (op.stage, op.chunk)
        if key not in self._uses:
            module, groups = self.modules[op.stage], self.schedule.layer_groups
            used = {id(self._owner[id(p)]): self._owner[id(p)]
                    for _, p in module.chunk_parameters(op.chunk, groups)
                    if id(p) in self._owner}
            self._uses[key] = [u for u in used.values() if u.sharded_at_rest]
        for unit in self._uses[key]:
            if unit.missing:
                where = f"stage {unit.stage}" + ("" if unit.chunk is None
                                                 else f" layer group {unit.chunk}")
                raise KernelsError(
                    f"op {op} computes with the parameters of {where}, which are sharded "
                    f"here ({unit.missing} elements not gathered, NaN): the schedule has no "
                    f"parameter ALL_GATHER of them before this op since they were resharded")

    def _reshard_after(self, index: int) -> None:
        for gather in self.releases.get(index, ()):
            unit = self.ranges[gather][0]
            if unit.sharded_at_rest:
                unit.poison()

    # --- collectives ----------------------------------------------------------------
    def _dp_collective(self, op: Op, state: Any) -> None:
        unit, (lo, hi), chained = self.ranges[self.index]
        if op.kind is OpKind.ALL_GATHER:
            self._all_gather(op, unit, lo, hi)
            return
        if op.kind in (OpKind.BROADCAST, OpKind.REDUCE):
            self._rooted(op, unit, lo, hi)
            return
        if op.kind is OpKind.ALL_REDUCE and chained is not None:
            flat = self._pieces.pop(chained)
            after = lambda: self._accumulate(unit, lo, hi, flat)  # noqa: E731
        elif op.kind is OpKind.ALL_REDUCE:
            flat = unit.read(lo, hi, grad=True)
            after = lambda: unit.write(lo, hi, flat, grad=True)  # noqa: E731
        else:
            flat = unit.read(lo, hi, grad=True)
            unit.consume_grad(lo, hi)
            index = self.index
            after = lambda: self._keep_shard(index, unit, lo, hi, flat)  # noqa: E731
        _, size = self._rank_in(op.group)
        if op.group == PP_COPIES:  # DualPipe: each copy now holds the two copies' mean
            self.summed_grads.update(unit.names)

        def finish() -> None:
            flat.div_(size)
            after()

        info = {"group_size": size}
        if op.kind is OpKind.REDUCE_SCATTER:
            info["emulated"] = "all_reduce + slice"
        self._collective(op, lambda: dist.all_reduce(flat, group=self._group(op.group),
                                                     async_op=True),
                         flat, flat.numel() * flat.element_size(), info, finish)

    def _rooted(self, op: Op, unit: ParamUnit, lo: int, hi: int) -> None:
        """torch.nn.DataParallel's collectives, rooted at the group's first rank: the
        parameters broadcast from it, or the gradients summed onto it (each replica's
        already divided by dp: kernels.executor's loss divisor), the others' then dropped."""
        me, size = self._rank_in(op.group)
        root = self.setup.group_ranks[op.group][0] if not self.setup.loopback else 0
        broadcast = op.kind is OpKind.BROADCAST
        flat = unit.read(lo, hi, grad=not broadcast)

        def finish() -> None:
            if broadcast and me:
                unit.write(lo, hi, flat)
            elif not broadcast:
                unit.write(lo, hi, flat, grad=True) if me == 0 else unit.consume_grad(lo, hi)

        group = self._group(op.group) if not self.setup.loopback else None
        post = ((lambda: dist.broadcast(flat, src=root, group=group, async_op=True))
                if broadcast else
                (lambda: dist.reduce(flat, dst=root, group=group, async_op=True)))
        self._collective(op, post, flat, flat.numel() * flat.element_size(),
                         {"group_size": size, "root": root}, finish)

    def _keep_shard(self, index: int, unit: ParamUnit, lo: int, hi: int,
                    reduced: torch.Tensor) -> None:
        piece = torch.cat([reduced[c - lo:d - lo] for c, d, _ in unit.master_positions(lo, hi)]
                          or [reduced[:0]])
        if index in self._chained:
            self._pieces[index] = piece
        else:
            self._accumulate(unit, lo, hi, piece)

    @staticmethod
    def _accumulate(unit: ParamUnit, lo: int, hi: int, piece: torch.Tensor) -> None:
        if unit.grad_shard is None:
            unit.grad_shard = torch.zeros(unit.owned_count, dtype=torch.float32,
                                          device=piece.device)
        offset = 0
        for c, d, position in unit.master_positions(lo, hi):
            unit.grad_shard[position:position + d - c] += piece[offset:offset + d - c]
            offset += d - c

    def _all_gather(self, op: Op, unit: ParamUnit, lo: int, hi: int) -> None:
        me, size = self._rank_in(op.group)
        parts = [intersect(owned_ranges(unit.buckets, size, r), lo, hi) for r in range(size)]
        lengths = [sum(b - a for a, b in ranges) for ranges in parts]
        width = max(lengths)
        mine = unit.read(0, 0).new_zeros(width)
        if lengths[me]:
            mine[:lengths[me]] = torch.cat([unit.read(a, b) for a, b in parts[me]])
        outs = [torch.empty_like(mine) for _ in range(size)]

        def finish() -> None:
            for r, ranges in enumerate(parts):
                offset = 0
                for a, b in ranges:
                    if r != me:
                        unit.write(a, b, outs[r][offset:offset + b - a])
                    offset += b - a
            unit.missing = max(0, unit.missing - (sum(lengths) - lengths[me]))

        wire = width * size * mine.element_size()
        self._collective(op, lambda: dist.all_gather(outs, mine, group=self._group(op.group),
                                                     async_op=True),
                         outs, (hi - lo) * mine.element_size(),
                         {"group_size": size, "wire_bytes": wire}, finish)

    def _collective(self, op: Op, post: Any, keep: Any, nbytes: int, info: dict,
                    finish: Any) -> None:
        """Post a collective (loopback: apply it at once, a group of one, no span)."""
        if self.setup.loopback:
            finish()
            return
        start = self.clock.mark()
        self._post(op, op.group, post(), keep, nbytes, start, info, finish)

    def _group(self, axis: str) -> Any:
        if axis not in self.setup.groups:
            raise KernelsError(f"no process group for axis {axis!r}")
        return self.setup.groups[axis]

    # --- optimizer step -------------------------------------------------------------
    def _opt_step(self, op: Op, state: Any) -> None:
        if self.single_process and self._rank_in(DP)[0]:
            return  # torch.nn.DataParallel steps on GPU 0 only; the next forward broadcasts
        units = [u for u in self.units.values() if u.stage == op.stage]
        if op.stage in self._tied_stages:
            sum_tied_grad(self.modules[op.stage], self._group(AXIS))
            self.summed_grads.add(WORD_EMBEDDING)
        if self.stash:
            self.stash.before_step(op.stage)
        start = self.clock.mark()
        for unit in units:
            if unit.group is None:
                grad = unit.read(0, unit.numel, grad=True)
            elif unit.grad_shard is None:
                raise KernelsError(f"op {op}: the gradients of stage {unit.stage} were not "
                                   f"reduce-scattered before its optimizer step")
            else:
                grad = unit.grad_shard
            if unit.adam is None:
                unit.adam = FlatAdam(unit.read_owned())
            master = unit.adam.step(grad).to(unit.params[0].dtype)
            offset = 0
            for a, b in unit.owned:
                unit.write(a, b, master[offset:offset + b - a])
                offset += b - a
        if self.stash:
            self.stash.after_step(op.stage)
        self._compute_span(op, start)

    # --- results --------------------------------------------------------------------
    def export_grads(self) -> dict[str, torch.Tensor]:
        """Reduced gradients by name: a sharded unit's owned elements (NaN elsewhere:
        kernels.results.gather_state merges a DP group's shards), else `.grad` (a tied
        copy's: the sum over both copies once stepped, `summed_grads`)."""
        out = {}
        for unit in self.units.values():
            if unit.grad_shard is None:
                out.update({n: p.grad.detach().cpu().clone() for n, p in
                            zip(unit.names, unit.params) if p.grad is not None})
                continue
            flat = torch.full((unit.numel,), float("nan"), dtype=torch.float32)
            for c, d, position in unit.master_positions(0, unit.numel):
                flat[c:d] = unit.grad_shard[position:position + d - c].cpu()
            out.update(_by_name(unit, flat))
        return out

    def export_params(self) -> dict[str, torch.Tensor]:
        """Parameters as this rank holds them (NaN where resharded), by name."""
        return {n: p.detach().cpu().clone() for u in self.units.values()
                for n, p in zip(u.names, u.params)}


def _by_name(unit: ParamUnit, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    return {n: flat[a:b].view(p.shape).to(p.dtype) for n, p, a, b in
            zip(unit.names, unit.params, unit.offsets, unit.offsets[1:])}
