"""The costs pass: attach FLOPs and bytes from the plan's per-stage costs to every op.

Compute ops get the stage's FLOPs and HBM traffic (F: forward; B: backward; I and W: half
of backward each, the split of Qi et al. 2024, "Zero Bubble Pipeline Parallelism", where
each takes one GEMM per forward GEMM). P2P ops get the stage boundary's activation bytes.
A chunked op (`Op.chunk`, a layer group of the data-parallel pass) costs its group
(Plan.costs_of: schedules.layer_groups). Data-parallel ops that their pass already sized
(schedules.data_parallel: collectives, copies, optimizer steps) keep their bytes; an
unsized DP gradient collective gets the gradient bytes of its stage (or group).
"""
from __future__ import annotations

from collections.abc import Callable

from .costs import StageCost
from .errors import ConfigError
from .names import DP
from .ops import WORK_KINDS, Op, OpKind
from .p2p import boundary
from .plan import Plan
from .schedule import Schedule


def work_costs(kind: OpKind, c: StageCost) -> tuple[float, int]:
    """(FLOPs, HBM bytes) of a compute op of `kind` (F, B, I or W) on a stage or layer
    group costing `c`: the rule of this pass (module docstring)."""
    if kind is OpKind.F:
        return c.forward_flops, c.forward_bytes
    if kind is OpKind.B:
        return c.backward_flops, c.backward_bytes
    return c.backward_flops / 2, c.backward_bytes // 2


def _costs(op: Op, plan: Plan) -> tuple[float, int] | None:
    """(FLOPs, bytes) this pass gives `op` (module docstring); None: it keeps its own."""
    if op.kind in WORK_KINDS:
        return work_costs(op.kind, plan.costs_of(op.stage, op.chunk))
    if op.kind.is_p2p:
        return op.flops, plan.stage_costs[boundary(op.kind, op.stage)].boundary_bytes
    if op.kind.is_collective and op.group == DP and not op.nbytes:
        return op.flops, plan.costs_of(op.stage, op.chunk).grad_bytes
    return None


def _costing(plan: Plan) -> Callable[[Op], Op]:
    """op -> the op costed from `plan`: the costs found once per (kind, stage, chunk,
    group) (a deep pipeline has millions of ops and few such kinds), and the op itself
    when it already carries them (the P2P pass sizes its transfers from the plan too)."""
    found: dict[tuple, tuple[float, int] | None] = {}

    def costed(op: Op) -> Op:
        key = (op.kind, op.stage, op.chunk, op.group, not op.nbytes, op.flops)
        costs = found.get(key, key)
        if costs is key:
            costs = found[key] = _costs(op, plan)
        if costs is None:
            return op
        flops, nbytes = costs
        if (flops, type(flops), nbytes, type(nbytes)) == (op.flops, type(op.flops), op.nbytes,
                                                          type(op.nbytes)):
            return op
        return op.with_costs(flops=flops, nbytes=nbytes)
    return costed


def annotate(schedule: Schedule, plan: Plan) -> Schedule:
    """`schedule` with every op costed from `plan` (module docstring)."""
    if schedule.num_stages != plan.num_stages:
        raise ConfigError(f"schedule has {schedule.num_stages} stages, the plan "
                          f"{plan.num_stages}")
    groups = schedule.layer_groups
    if groups not in (1, plan.layer_groups):
        raise ConfigError(f"schedule splits stages into {groups} layer groups, the plan's "
                          f"data-parallel pass into {plan.layer_groups} "
                          f"(schedules.layer_groups.data_parallel_groups)")
    if plan.model.lora and any(op.kind in (OpKind.I, OpKind.W)
                               for p in schedule.programs for op in p):
        raise ConfigError("LoRA with a split backward (I and W ops, e.g. zero-bubble "
                          "schedules): this pass halves a backward into I and W, but a frozen "
                          "layer's weight gradients are only its adapters'; use a schedule "
                          "with whole B ops")
    costed = _costing(plan)
    return schedule.with_programs([[costed(op) for op in p] for p in schedule.programs])
