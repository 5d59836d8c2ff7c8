"""The activations a schedule holds, once per schedule shape, for the memory check of
every layout that runs it.

`schedules.memory_model.rank_memory` walks the compute-only programs with unit-time steps
(schedules.timeline_metrics.peak_in_flight: a (stage, microbatch) is held from its forward
to its backward, or to its W after an I) and weighs each held stage by its activation
bytes. The walk depends only on the shape (schedule, pp, vpp, microbatches); the bytes on
the layout. `HeldStages` walks once and keeps, per pipeline rank, the Pareto-maximal
vectors of microbatches held per stage; the peak bytes of any layout are then the largest
dot product of one of them with the stages' bytes: the same number as the walk
(tests/test_planner_memory.py), at a cost independent of the microbatch count.
Units: bytes, microbatch counts.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from clustersim.schedules.memory_model import RankMemory, rank_memory
from clustersim.schedules.ops import OpKind
from clustersim.schedules.activation_partition import stage_activation_bytes
from clustersim.schedules.plan import Plan
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.schedule import Schedule

Shape = tuple[str, int, int, int]  # (schedule, pp, vpp, microbatches)


@lru_cache(maxsize=256)
def compute_schedule(shape: Shape) -> Schedule:
    """The compute-only schedule of a shape (schedules.registry), built once."""
    name, pp, vpp, microbatches = shape
    return build_schedule(name, pp, microbatches, vpp)


def _pareto(vectors: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The vectors no other one dominates (>= everywhere)."""
    ordered = sorted(vectors, key=sum, reverse=True)
    kept: list[tuple[int, ...]] = []
    for v in ordered:
        if not any(all(a >= b for a, b in zip(k, v)) for k in kept):
            kept.append(v)
    return kept


@lru_cache(maxsize=1024)
def held_stages(shape: Shape) -> tuple[tuple[tuple[int, ...], list[tuple[int, ...]]], ...]:
    """Per pipeline rank: (its stages, the Pareto-maximal vectors of microbatches it holds
    per stage at once), by the unit-time walk of the module docstring."""
    schedule = compute_schedule(shape)
    split = {(op.stage, op.microbatch) for op in schedule.ops() if op.kind is OpKind.W}
    out = []
    for program in schedule.programs:
        stages = tuple(sorted({op.stage for op in program}))
        index = {s: i for i, s in enumerate(stages)}
        level = [0] * len(stages)
        seen: set[tuple[int, ...]] = set()
        for op in program:
            i = index[op.stage]
            if op.kind is OpKind.F:
                level[i] += 1
            seen.add(tuple(level))
            if op.kind in (OpKind.B, OpKind.W) or (
                    op.kind is OpKind.I and (op.stage, op.microbatch) not in split):
                level[i] -= 1
        out.append((stages, _pareto(seen)))
    return tuple(out)


def peak_memory(plan: Plan, parts: tuple | None = None) -> list[float]:
    """Device bytes of each pipeline rank at its peak: rank_memory's static terms plus
    the held activations (module docstring); `parts`: `_parts(plan)`, where known."""
    static, device_bytes, held = parts or _parts(plan)
    return [m.total_bytes + max(sum(n * device_bytes[s] for n, s in zip(v, stages))
                                for v in vectors)
            for m, (stages, vectors) in zip(static, held())]


def fits(plan: Plan, capacity: float) -> bool:
    """Whether every pipeline rank's peak (`peak_memory`) is at most `capacity` bytes,
    deciding without the walk where the bracket does: a rank holds at least one
    microbatch of its largest stage (during that stage's forward) and at most all M
    microbatches of every stage it holds."""
    parts = _parts(plan)
    static, device_bytes, _ = parts
    m = plan.num_microbatches
    low = [s.total_bytes + max(device_bytes[x] for x in plan.stages_of(s.pp_rank))
           for s in static]
    high = [s.total_bytes + m * sum(device_bytes[x] for x in plan.stages_of(s.pp_rank))
            for s in static]
    if max(low) > capacity:
        return False
    if max(high) <= capacity:
        return True
    return max(peak_memory(plan, parts)) <= capacity


def _parts(plan: Plan):
    """(rank_memory without activations, device activation bytes per stage, a function
    giving held_stages of the plan's shape)."""
    shape = (plan.schedule, plan.pp, plan.stages_per_rank, plan.num_microbatches)
    static: Sequence[RankMemory] = rank_memory(plan, in_flight=[0] * plan.num_stages)
    return static, stage_activation_bytes(plan)[0], lambda: held_stages(shape)
