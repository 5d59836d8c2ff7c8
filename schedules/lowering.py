"""The lowering: the one list of passes that takes a compute-only schedule to the program
both backends run (the simulator's replay and the kernels' executor), each pass a function
(schedule, plan) -> schedule, in the style of torch.distributed.pipelining's list-to-list
passes and the zero-bubble scheduler's single pass list:

1. structure: every (stage, microbatch) has one forward and one backward on the rank
   that holds its stage (schedules.validate.check_structure); changes nothing;
2. data parallel: DDP buckets, ZeRO 1-3, FSDP/HSDP, ZeRO++, offload, optimizer steps
   (schedules.data_parallel, schedules.zero3);
3. P2P: the SEND/RECV ops between stages on different ranks (schedules.p2p);
4. costs: FLOPs and bytes of every op from the plan (schedules.annotate);
5. intra-layer: the TP, SP, CP, EP and expert-TP collectives of every compute op
   (schedules.intra_layer), then ZeRO-R's checkpoint all-gathers and host copies
   (schedules.activation_partition), which belong to the same compute ops.
Each pass says when a schedule is past it (`Pass.done`), and `lower` skips it then: a
schedule handed in partly lowered (a custom one, or one whose data-parallel ops were
edited by hand) keeps what it has, and lowering a lowered schedule changes nothing (the
costs pass is past once the intra-layer pass has run, since that pass adjusts costs:
scattered P2P bytes, imbalanced experts' FLOPs). Memory is not a pass: the simulator's
memory model (sim.memory) reads the lowered schedule and the plan. docs/architecture.md,
"The lowering".
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .activation_partition import add_checkpoint_ops
from .annotate import annotate
from .data_parallel import add_data_parallel, has_data_parallel
from .errors import ConfigError
from .intra_layer import add_intra_layer, has_intra_layer
from .p2p import add_p2p
from .plan import Plan
from .schedule import Schedule
from .validate import check_structure


@dataclass(frozen=True)
class Pass:
    """One lowering pass: `run` it unless the schedule is `done` with it."""

    name: str
    run: Callable[[Schedule, Plan], Schedule]
    done: Callable[[Schedule], bool] = lambda schedule: False


def _structure(schedule: Schedule, plan: Plan) -> Schedule:
    check_structure(schedule)
    return schedule


def _p2p(schedule: Schedule, plan: Plan) -> Schedule:
    """The P2P pass. Where the costs pass runs after it, the transfers carry the boundary
    bytes that pass gives them, so it keeps them as they are (no second op per
    transfer); where it does not (a schedule that came with its intra-layer ops), they
    carry none, as they always did."""
    if has_intra_layer(schedule):
        return add_p2p(schedule)
    return add_p2p(schedule, lambda stage: plan.stage_costs[stage].boundary_bytes)


def _intra_layer(schedule: Schedule, plan: Plan) -> Schedule:
    return add_checkpoint_ops(add_intra_layer(schedule, plan), plan)


PASSES: tuple[Pass, ...] = (
    Pass("structure", _structure),
    Pass("data-parallel", add_data_parallel, has_data_parallel),
    Pass("p2p", _p2p, lambda schedule: schedule.has_p2p),
    Pass("costs", annotate, has_intra_layer),
    Pass("intra-layer", _intra_layer, has_intra_layer),
)


def lower(schedule: Schedule, plan: Plan) -> Schedule:
    """`schedule` (of `plan`'s shape) through every pass of PASSES, in order."""
    if (schedule.num_ranks, schedule.stage_ranks, schedule.iteration_microbatches) != (
            plan.pp, plan.stage_ranks, plan.num_microbatches):
        raise ConfigError(f"schedule {schedule.name!r} ({schedule.num_ranks} ranks, stages on "
                          f"ranks {list(schedule.stage_ranks)}, {schedule.iteration_microbatches} "
                          f"microbatches) is not the shape its plan was resolved for "
                          f"({plan.pp} ranks, {list(plan.stage_ranks)}, "
                          f"{plan.num_microbatches} microbatches)")
    for step in PASSES:
        if not step.done(schedule):
            schedule = step.run(schedule, plan)
    return schedule
