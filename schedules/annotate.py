"""Lowering pass: attach FLOPs and bytes from per-stage costs to every op of a schedule.

Compute ops get the stage's FLOPs and HBM traffic (F: forward; B: backward; I and W: half
of backward each, the split of Qi et al. 2024, "Zero Bubble Pipeline Parallelism", where
each takes one GEMM per forward GEMM). P2P ops get the stage boundary's activation bytes.
A chunked op (`Op.chunk`, a layer group) costs its group: `chunk_costs[s][g]`
(schedules.layer_groups.group_costs). Data-parallel ops that their pass already sized
(schedules.data_parallel: collectives, copies, optimizer steps) keep their bytes; an
unsized DP gradient collective gets the gradient bytes of its stage (or group).
"""
from __future__ import annotations

from collections.abc import Sequence

from .costs import StageCost
from .errors import ConfigError
from .ops import Op, OpKind
from .p2p import add_p2p, boundary
from .schedule import Schedule


def _costed(op: Op, costs: Sequence[StageCost],
            chunk_costs: Sequence[Sequence[StageCost]] | None) -> Op:
    c = costs[op.stage] if op.chunk is None else chunk_costs[op.stage][op.chunk]
    if op.kind is OpKind.F:
        return op.with_costs(flops=c.forward_flops, nbytes=c.forward_bytes)
    if op.kind is OpKind.B:
        return op.with_costs(flops=c.backward_flops, nbytes=c.backward_bytes)
    if op.kind in (OpKind.I, OpKind.W):
        return op.with_costs(flops=c.backward_flops / 2, nbytes=c.backward_bytes // 2)
    if op.kind.is_p2p:
        return op.with_costs(nbytes=costs[boundary(op.kind, op.stage)].boundary_bytes)
    if op.kind.is_collective and op.group == "dp" and not op.nbytes:
        return op.with_costs(nbytes=c.grad_bytes)
    return op


def annotate(schedule: Schedule, costs: Sequence[StageCost],
             chunk_costs: Sequence[Sequence[StageCost]] | None = None) -> Schedule:
    """Lower `schedule` (adding P2P ops if absent) and cost every op from `costs[stage]`
    (`chunk_costs[stage][chunk]` for chunked ops; needed when the schedule has any)."""
    if len(costs) != schedule.num_stages:
        raise ConfigError(
            f"got costs for {len(costs)} stages, schedule has {schedule.num_stages}")
    groups = schedule.layer_groups
    if groups > 1 and (chunk_costs is None or len(chunk_costs) != schedule.num_stages
                       or any(len(row) != groups for row in chunk_costs)):
        raise ConfigError(f"schedule splits stages into {groups} layer groups: annotate needs "
                          f"chunk_costs[stage][group] for {schedule.num_stages} stages x "
                          f"{groups} groups (schedules.layer_groups.group_costs)")
    lowered = add_p2p(schedule)
    return lowered.with_programs([[_costed(op, costs, chunk_costs) for op in p]
                                  for p in lowered.programs])
