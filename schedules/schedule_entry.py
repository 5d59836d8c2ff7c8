"""ScheduleEntry: what the registry (schedules.registry) knows of one pipeline schedule."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .errors import ConfigError
from .limits import MAX_OPS, check_op_budget
from .ops import Op
from .placement import LOOP, PLACEMENTS, stage_ranks, stages_by_rank
from .schedule import Schedule
from .weight_stashing import AsyncRun, WeightStashing, simulated_batches

Programs = Callable[[list[list[int]], int], list[list[Op]]]
"""(the stages each rank holds, in stage order, as the entry's placement gives them;
microbatches) -> the compute-only program of each pipeline rank."""


@dataclass(frozen=True)
class ScheduleEntry:
    """A schedule: `name` as in the literature, the other spellings it answers to
    (`aliases`: torch.distributed.pipelining class names, Megatron's and papers' names;
    matched case-insensitively, '_' = '-'), its generator, its virtual-stage rule (vpp
    from `min_vpp` to `max_vpp`, None = unbounded; `default_vpp` when not given), its
    placement, its `source` and a one-line `summary` for the help. `built_from_costs`:
    the order depends on a run's simulated costs (sim.auto_schedule builds it); it has no
    order of its own to `build`.
    `microbatch_rule(pp, microbatches)`: any further rule on the microbatch count, the
    reason for refusing it (one line naming the rule) or None."""

    name: str
    programs: Programs
    source: str
    summary: str
    aliases: tuple[str, ...] = ()
    default_vpp: int = 1
    min_vpp: int = 1
    max_vpp: int | None = 1
    placement: str = LOOP
    built_from_costs: bool = False
    microbatch_rule: Callable[[int, int], str | None] | None = None  # (pp, M) -> why not
    stashing: WeightStashing | None = None
    chains: int = 1  # stage chains (directions): DualPipe's 2 (schedules.chains)

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"schedule {self.name!r}: unknown placement {self.placement!r}")

    def check(self, pp: int, microbatches: int, vpp: int) -> None:
        """Raise ConfigError naming the field and the rule unless the schedule runs with
        these degrees."""
        if pp < 1:
            raise ConfigError(f"pp (pipeline-model-parallel-size) must be >= 1, got {pp}")
        if microbatches < 1:
            raise ConfigError(f"microbatches must be >= 1, got {microbatches}")
        if self.max_vpp == 1 and vpp != 1:
            raise ConfigError(f"schedule {self.name!r} runs one model chunk per rank: it needs "
                              f"vpp == 1, got vpp={vpp} (the schedules with several chunks "
                              f"per rank: `clustersim simulate --help`, --schedule)")
        if vpp < self.min_vpp or (self.max_vpp is not None and vpp > self.max_vpp):
            most = "" if self.max_vpp is None else f" and <= {self.max_vpp}"
            raise ConfigError(f"schedule {self.name!r} needs vpp >= {self.min_vpp}{most} "
                              f"(virtual-pipeline-model-parallel-size), got vpp={vpp}")
        why = self.microbatch_rule(pp, microbatches) if self.microbatch_rule else None
        if why:
            raise ConfigError(f"schedule {self.name!r}: {why}")

    def build(self, pp: int, microbatches: int, vpp: int | None = None,
              max_ops: int = MAX_OPS) -> Schedule:
        """The compute-only Schedule (vpp None = default_vpp), refused before it is built
        when it would exceed `max_ops` (schedules.limits)."""
        vpp = self.default_vpp if vpp is None else vpp
        self.check(pp, microbatches, vpp)
        if self.built_from_costs:
            raise ConfigError(f"schedule {self.name!r} is built from a run's simulated costs: "
                              f"`clustersim simulate` and `compare` build it; it has no fixed "
                              f"order to show or to run on devices")
        run = self.async_run(pp, microbatches)
        total = microbatches * (run.batches if run else 1)
        check_op_budget(pp * vpp, total, max_ops)
        stages = pp * vpp
        programs = self.programs(stages_by_rank(self.placement, pp, stages), total)
        return Schedule(self.name, total, programs, stages,
                        stage_ranks(self.placement, pp, stages), asynchronous=run,
                        chains=self.chains)

    def async_run(self, pp: int, microbatches: int) -> AsyncRun | None:
        """The AsyncRun of an asynchronous schedule (None for a flushed one)."""
        if self.stashing is None:
            return None
        return AsyncRun(self.stashing, microbatches, simulated_batches(pp, microbatches))

    def simulated_microbatches(self, pp: int, microbatches: int) -> int:
        """The microbatches the program runs: M, or K*M for an asynchronous schedule."""
        run = self.async_run(pp, microbatches)
        return microbatches * (run.batches if run else 1)
