"""Flat parameter units of one rank: what the data-parallel ops of its program act on.

A unit is the parameters of one stage, or of one layer group (`Op.chunk`) of a stage when
the program gathers parameters per group (ZeRO-3 / FSDP units), flattened in layer-group
then module order. A parameter shared by two groups of a stage (the tied word embedding
at one stage) belongs to the first group that uses it, as schedules.layer_groups counts
it; one shared by two stages of a rank (tied first and last stage on one rank) is in
both stages' units, as schedules.costs counts a copy per stage (kernels.launch refuses
sharding or stepping it twice). Flat offsets are elements of the model dtype.

Ownership (sharded units, those the program reduce-scatters or gathers over a DP group of
N ranks) follows Megatron-LM's distributed optimizer: each parameter ALL_GATHER bucket
[a, b) of the unit is split into N equal parts of ceil((b-a)/N) elements and rank i of the
group owns part i; a unit without gathers is one bucket. A unit that no collective shards
is owned whole (DDP). The optimizer state covers exactly the owned elements.

Collective ranges: bucketed ops of one unit (and layer group) cover consecutive ranges
of it, op.nbytes / element size elements each (nbytes 0: the whole range); a replica
ALL_REDUCE chained to a reduce-scatter (HSDP) acts on that reduce-scatter's range.

Parameters are written through `.data`, which autograd's version counter does not see:
as in FSDP, a backward whose forward saved a parameter that was since resharded and
gathered again computes with what the parameter's storage holds when it runs (the
gathered values, or NaN when the gather is missing).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from clustersim.schedules.contract import (ProgramContract, is_gradient_collective,
                                           is_parameter_gather)
from clustersim.schedules.ops import WORK_KINDS, Op, OpKind

from .errors import KernelsError
from .optimizer import FlatAdam
from .stage import StageModule

Range = tuple[int, int]


def owned_ranges(buckets: list[Range], size: int, index: int) -> list[Range]:
    """Flat ranges that rank `index` of a group of `size` owns: part `index` of each
    bucket split into `size` parts of ceil(len/size) elements (empty parts dropped)."""
    out = []
    for a, b in buckets:
        q = math.ceil((b - a) / size)
        lo, hi = a + index * q, min(a + (index + 1) * q, b)
        if lo < hi:
            out.append((lo, hi))
    return out


def intersect(ranges: list[Range], lo: int, hi: int) -> list[Range]:
    return [(max(a, lo), min(b, hi)) for a, b in ranges if max(a, lo) < min(b, hi)]


@dataclass(eq=False)
class ParamUnit:
    """One unit's parameters as a flat vector, its ownership and its optimizer shard."""

    stage: int
    chunk: int | None
    names: list[str]
    params: list[nn.Parameter]
    spans: dict[int | None, Range]  # flat range of each layer group (None: the unit)
    group: str | None = None  # the DP group axis that shards it; None = replicated
    buckets: list[Range] = field(default_factory=list)
    owned: list[Range] = field(default_factory=list)
    sharded_at_rest: bool = False  # ZeRO-3: only the owned part is valid between uses
    missing: int = 0  # non-owned elements that hold no valid value (resharded)
    grad_shard: torch.Tensor | None = None  # reduced gradients of the owned elements
    adam: FlatAdam | None = None
    offsets: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.offsets = [0]
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())

    @property
    def numel(self) -> int:
        return self.offsets[-1]

    @property
    def owned_count(self) -> int:
        return sum(b - a for a, b in self.owned)

    def _slices(self, lo: int, hi: int):
        """(parameter, start, end) pieces of flat range [lo, hi), in order."""
        for p, start, end in zip(self.params, self.offsets, self.offsets[1:]):
            a, b = max(lo, start), min(hi, end)
            if a < b:
                yield p, a - start, b - start

    def read(self, lo: int, hi: int, grad: bool = False) -> torch.Tensor:
        """A copy of the flat range of the parameters (or of their .grad; None = zeros)."""
        parts = []
        for p, a, b in self._slices(lo, hi):
            src = p.grad if grad else p
            parts.append(torch.zeros(b - a, dtype=p.dtype, device=p.device) if src is None
                         else src.detach().reshape(-1)[a:b])
        return torch.cat(parts) if parts else self.params[0].new_zeros(0)

    @torch.no_grad()
    def write(self, lo: int, hi: int, values: torch.Tensor, grad: bool = False) -> None:
        offset = 0
        for p, a, b in self._slices(lo, hi):
            if grad and p.grad is None:
                p.grad = torch.zeros_like(p)
            elif grad and not p.grad.is_contiguous():  # a W pass's view (torch's
                p.grad = p.grad.contiguous()  # stage_backward_weight assigns it as is)
            dst = p.grad if grad else p.data  # .data: no version bump (module docstring)
            dst.view(-1)[a:b].copy_(values[offset:offset + b - a])
            offset += b - a

    @torch.no_grad()
    def consume_grad(self, lo: int, hi: int) -> None:
        """The gradients of [lo, hi) were handed to a reduce-scatter: drop them (a whole
        parameter's .grad becomes None, part of one is zeroed)."""
        for p, a, b in self._slices(lo, hi):
            if p.grad is None:
                continue
            if b - a == p.numel():
                p.grad = None
            else:
                p.grad.view(-1)[a:b].zero_()

    def master_positions(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """(flat lo, flat hi, position in the owned shard) of owned elements in [lo, hi)."""
        out, position = [], 0
        for a, b in self.owned:
            c, d = max(a, lo), min(b, hi)
            if c < d:
                out.append((c, d, position + c - a))
            position += b - a
        return out

    def read_owned(self) -> torch.Tensor:
        return torch.cat([self.read(a, b) for a, b in self.owned])

    @torch.no_grad()
    def poison(self) -> None:
        """Reshard: every element this rank does not own becomes NaN, so a computation
        that uses the unit without gathering it first produces NaN."""
        owned = self.read_owned()
        for p in self.params:
            p.data.fill_(float("nan"))
        offset = 0
        for a, b in self.owned:
            self.write(a, b, owned[offset:offset + b - a])
            offset += b - a
        self.missing = self.numel - self.owned_count


def build_units(modules: dict[int, StageModule], program: list[Op], groups: int,
                contract: ProgramContract, rank_in: Callable[[str], tuple[int, int]]
                ) -> dict[tuple[int, int | None], ParamUnit]:
    """The units of this rank's stages (module docstring); `rank_in(axis)` gives this
    rank's (index, size) in the process group of a DP axis."""
    units: dict[tuple[int, int | None], ParamUnit] = {}
    for s in sorted(modules):
        seen: set[int] = set()
        per_chunk = any(is_parameter_gather(op) and op.stage == s and op.chunk is not None
                        for op in program)
        chunks = []
        for g in range(groups):
            mine = [(n, p) for n, p in modules[s].chunk_parameters(g, groups)
                    if id(p) not in seen and p.requires_grad]
            seen.update(id(p) for _, p in mine)
            chunks.append(mine)
        if per_chunk:
            for g, mine in enumerate(chunks):
                if mine:  # a layer group without parameters is no FSDP unit
                    units[(s, g)] = _unit(s, g, [mine])
        else:
            units[(s, None)] = _unit(s, None, chunks)
    sharded = {id(units[key]) for key in _gathered_units(program, contract, units)}
    for unit in units.values():
        _shard(unit, program, rank_in, id(unit) in sharded)
    return units


def _unit(stage: int, chunk: int | None, chunks: list[list]) -> ParamUnit:
    names, params, spans, offset = [], [], {}, 0
    for g, mine in enumerate(chunks):
        size = sum(p.numel() for _, p in mine)
        spans[g if chunk is None else chunk] = (offset, offset + size)
        offset += size
        names += [n for n, _ in mine]
        params += [p for _, p in mine]
    spans[None] = (0, offset)
    return ParamUnit(stage, chunk, names, params, spans)


def unit_of(units: dict, op: Op) -> tuple[ParamUnit, Range]:
    """The unit a DP op of (stage, chunk) acts on and the flat range of its layer group."""
    if op.chunk is not None and (op.stage, op.chunk) in units:
        unit = units[(op.stage, op.chunk)]
        return unit, unit.spans[None]
    if (op.stage, None) not in units:
        raise KernelsError(f"op {op}: this rank holds no parameters of stage {op.stage}"
                           + ("" if op.chunk is None else f" layer group {op.chunk}"))
    unit = units[(op.stage, None)]
    return unit, unit.spans[op.chunk]


def _bytes(op: Op, unit: ParamUnit, lo: int, hi: int) -> int:
    """Bytes of the range `op` covers: op.nbytes, or the whole range when it is 0."""
    return op.nbytes or (hi - lo) * unit.params[0].element_size()


def _element_range(unit: ParamUnit, lo: int, start: int, nbytes: int) -> Range:
    """Elements covered by bytes [start, start + nbytes) of a range starting at element
    `lo`: bucket edges that fall inside an element (schedules.data_parallel splits
    buckets by bytes) are rounded down to it."""
    size = unit.params[0].element_size()
    return lo + start // size, lo + (start + nbytes) // size


def _shard_gather(op: Op) -> bool:
    """A ZeRO / FSDP parameter ALL_GATHER, which implies sharded parameters (not
    torch.nn.DataParallel's BROADCAST of whole ones)."""
    return is_parameter_gather(op) and op.kind is OpKind.ALL_GATHER


def _shard(unit: ParamUnit, program: list[Op], rank_in: Callable, at_rest: bool) -> None:
    ops = [op for op in program if op.stage == unit.stage
           and (_shard_gather(op) or (is_gradient_collective(op)
                                       and op.kind is OpKind.REDUCE_SCATTER))
           and (unit.chunk is None or op.chunk == unit.chunk)]
    if not ops:
        unit.owned = [(0, unit.numel)]
        return
    unit.group = ops[0].group
    index, size = rank_in(unit.group)
    buckets, cursor, total = [], 0, unit.numel * unit.params[0].element_size()
    for op in ops:
        if _shard_gather(op) and cursor < total:
            n = min(_bytes(op, unit, 0, unit.numel), total - cursor)
            buckets.append(_element_range(unit, 0, cursor, n))
            cursor += n
    unit.buckets = buckets or [(0, unit.numel)]
    unit.owned = owned_ranges(unit.buckets, size, index)
    unit.sharded_at_rest = at_rest


def op_ranges(program: list[Op], units: dict, contract: ProgramContract
              ) -> dict[int, tuple[ParamUnit, Range, int | None]]:
    """index -> (unit, flat range, index of the reduce-scatter it reduces further or None)
    for each DP collective of the program (module docstring)."""
    out: dict[int, tuple[ParamUnit, Range, int | None]] = {}
    cursors: dict[tuple, int] = {}
    for index, op in enumerate(program):
        if not (is_gradient_collective(op) or is_parameter_gather(op)):
            continue
        unit, (lo, hi) = unit_of(units, op)
        chained = [j for j in contract.local[index]
                   if program[j].kind is OpKind.REDUCE_SCATTER and program[j].group != op.group]
        if op.kind is OpKind.ALL_REDUCE and chained:
            out[index] = (unit, out[chained[-1]][1], chained[-1])
            continue
        key = (op.kind, op.stage, op.chunk, op.group)
        start, n = cursors.get(key, 0), _bytes(op, unit, lo, hi)
        total = (hi - lo) * unit.params[0].element_size()
        if start + n > total:
            raise KernelsError(
                f"op {op}: {n} bytes from byte {start} overrun the {total} bytes of stage "
                f"{op.stage}" + ("" if op.chunk is None else f" group {op.chunk}")
                + "'s parameters: the schedule's sizes do not match the model's")
        out[index] = (unit, _element_range(unit, lo, start, n), None)
        cursors[key] = (start + n) % total if total else 0
    return out


def _gathered_units(program: list[Op], contract: ProgramContract, units: dict) -> set:
    keys = set()
    for index, op in enumerate(program):
        if op.kind in WORK_KINDS:
            for j in contract.local[index]:
                if _shard_gather(program[j]):
                    unit = unit_of(units, program[j])[0]
                    keys.add((unit.stage, unit.chunk))
    return keys
