"""Schedule: the ordered ops (the *program*) of each pipeline rank.

Programs are indexed by pipeline rank only. Ranks that differ by their TP/DP/CP/EP
coordinates run the same program (ops name group axes, not ranks), so the full world is
this program table plus the rank grid of a ParallelConfig.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain

from .errors import ConfigError
from .ops import P2P_KINDS, Op, OpKind, action_texts
from .chains import StageChains
from .placement import loop
from .weight_stashing import AsyncRun


@dataclass
class Schedule:
    """Per-rank programs of one pipeline replica.

    `stage_ranks[s]` is the pipeline rank that holds virtual stage `s` (schedules.placement;
    the default is the loop placement, rank r holding stages r, r+P, r+2P, ...).
    `layer_groups` G: how many layer groups every stage splits into for chunked ops
    (`Op.chunk` in 0..G-1; schedules.layer_groups); 1 = no chunked ops.
    `asynchronous`: an asynchronous pipeline with weight stashing (PipeDream, 2BW:
    schedules.weight_stashing), whose programs run `num_microbatches` = K batches of the
    iteration's M microbatches with no flush; None for a flushed schedule.
    `chains`: the stage chains (directions) the stages form, 1 but for DualPipe's 2
    (schedules.chains).
    """

    name: str
    num_microbatches: int
    programs: list[list[Op]]
    num_stages: int
    stage_ranks: tuple[int, ...] = field(default=())
    layer_groups: int = 1
    asynchronous: AsyncRun | None = None
    chains: int = 1

    def __post_init__(self) -> None:
        if not self.programs:
            raise ConfigError(f"schedule {self.name!r} has no programs (needs >= 1 rank)")
        if not self.stage_ranks:
            self.stage_ranks = loop(self.num_ranks, self.num_stages)
        if len(self.stage_ranks) != self.num_stages:
            raise ConfigError(
                f"stage_ranks has {len(self.stage_ranks)} entries, num_stages is {self.num_stages}"
            )
        bad = [r for r in self.stage_ranks if not 0 <= r < self.num_ranks]
        if bad:
            raise ConfigError(f"stage_ranks names rank {bad[0]}; ranks are 0..{self.num_ranks - 1}")
        if isinstance(self.layer_groups, bool) or not isinstance(self.layer_groups, int) \
                or self.layer_groups < 1:
            raise ConfigError(f"layer_groups must be a positive integer, got {self.layer_groups!r}")

    @property
    def stage_chains(self) -> StageChains:
        """Which stages neighbour which, and which microbatches each runs."""
        return StageChains(self.num_stages, self.chains, self.num_microbatches)

    @property
    def iteration_microbatches(self) -> int:
        """M, the microbatches of one iteration (of one batch when asynchronous)."""
        run = self.asynchronous
        return run.iteration_microbatches if run else self.num_microbatches

    @property
    def num_ranks(self) -> int:
        return len(self.programs)

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // self.num_ranks

    @property
    def has_p2p(self) -> bool:
        return any(op.kind in P2P_KINDS for op in self.ops())

    def rank_of_stage(self, stage: int) -> int:
        return self.stage_ranks[stage]

    def ops(self) -> Iterator[Op]:
        """Every op, program by program (a C-level chain: deep pipelines scan millions)."""
        return chain.from_iterable(self.programs)

    def compute_only(self) -> Schedule:
        """The same schedule with communication ops removed."""
        return self.with_programs([[op for op in p if op.kind.is_compute] for p in self.programs])

    def with_programs(self, programs: Sequence[Sequence[Op]],
                      layer_groups: int | None = None) -> Schedule:
        return Schedule(
            self.name, self.num_microbatches, [list(p) for p in programs], self.num_stages,
            self.stage_ranks, self.layer_groups if layer_groups is None else layer_groups,
            self.asynchronous, self.chains,
        )

    def to_text(self) -> str:
        """One line per rank: `rank R: 0F0 0F1 ...`, an overlapped pair as torch writes it,
        `(0F3;3B1)OVERLAP_F_B` (schedules.ops.action_texts)."""
        return "\n".join(f"rank {r}: " + " ".join(action_texts(program))
                         for r, program in enumerate(self.programs))

    def count(self, kind: OpKind) -> int:
        return sum(1 for op in self.ops() if op.kind is kind)
