"""Asynchronous pipelines with weight stashing: PipeDream and PipeDream-2BW.

Both run 1F1B with no flush: the next batch's forwards follow the last one's backwards
without waiting for the pipeline to drain, so its stages never idle in the steady state.
A microbatch's backward must then use the weights its forward used, although the stage
may have updated them in between: the stage stashes that version (weight stashing). With
p stages, rank r (stage r) runs w_r = p - 1 - r warm-up forwards, then alternates.
- **PipeDream** (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
  Training", SOSP 2019): every microbatch is a minibatch of its own and each stage steps
  its weights after each backward. A forward uses the newest version: F(i) on rank r runs
  after B(0 .. i - w_r - 1), so it uses version max(0, i - w_r) (the version after k
  updates is k), and its gradient is applied w_r updates later (the paper's
  W(t+1) = W(t) - nu grad f(W_1(t-p+1), ..., W_p(t)): staleness p - 1 - r on rank r).
  Rank r holds the versions of its p - r in-flight microbatches: p - r versions.
- **PipeDream-2BW** (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training",
  ICML 2021, section 3.1, "double-buffered weight updates"): gradients accumulate over a
  batch of M >= p microbatches and each stage steps once per batch; every microbatch of
  batch b uses version max(0, b - 1) on every stage (W(t+1) = W(t) - nu grad f(W(t-1)):
  staleness 1), so a stage holds two versions, the one in use and the newest.
PipeDream-Flush is 1F1B with its flush (schedules.pipelines.one_f_one_b).

**The steady state.** The program runs K = 2 + ceil((p - 1) / M) batches of M
microbatches back to back (`simulated_batches`): enough that rank 0's backwards of batch 1
all follow a forward (rank 0 runs F(j + p - 1) before B(j), and F exists up to K M - 1).
The iteration reported is batch 1 (`steady_window`): from the end of rank 0's backward of
microbatch M - 1 to the end of its backward of 2M - 1. Every rank does one batch of work
in that window, so its length is the steady-state time per batch (the pipeline's fill and
drain at the start and end of the run fall outside it), and the Timeline's metrics are
computed over it (schedules.timeline).

The memory model (schedules.memory_model) adds `versions_held - 1` copies of the stage's
weights in the model dtype; the kernels backend (kernels.stashing) stashes the versions
and its reference (kernels.reference.run_stale_reference) applies the same versions.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import ConfigError
from .ops import OpKind

PIPEDREAM, TWO_BW = "pipedream", "2bw"
WINDOW_BATCH = 1  # the simulated batch whose window is the reported iteration


@dataclass(frozen=True)
class WeightStashing:
    """How an asynchronous schedule versions its weights: `rule` PIPEDREAM (one update per
    microbatch, the newest version per forward) or TWO_BW (one update per batch of M, batch
    b on version b - 1). Formulas: module docstring."""

    rule: str

    def __post_init__(self) -> None:
        if self.rule not in (PIPEDREAM, TWO_BW):
            raise ValueError(f"unknown weight-stashing rule {self.rule!r}")

    def update_every(self, microbatches: int) -> int:
        """Microbatches whose gradients one weight update applies."""
        return 1 if self.rule == PIPEDREAM else microbatches

    def version_used(self, pp: int, rank: int, microbatch: int, microbatches: int) -> int:
        """The weight version (updates applied before it) the forward and backward of
        `microbatch` use on pipeline rank `rank`."""
        if self.rule == PIPEDREAM:
            return max(0, microbatch - (pp - 1 - rank))
        return max(0, microbatch // microbatches - 1)

    def versions_held(self, pp: int, rank: int) -> int:
        """Weight versions rank `rank` holds in the steady state, the live one included."""
        return pp - rank if self.rule == PIPEDREAM else 2

    def staleness(self, pp: int, rank: int) -> int:
        """Updates between the version a gradient was computed on and the one it updates."""
        return pp - 1 - rank if self.rule == PIPEDREAM else 1


def check_stashed_layout(name: str, zero_stage: int, fsdp: str, offload: bool) -> None:
    """Refuse the sharded optimizers under weight stashing: every version a stage stashes
    is its whole weights, and the data-parallel pass steps DDP's replicated optimizer
    (PipeDream's and 2BW's, with data parallelism per stage)."""
    if zero_stage or fsdp != "none" or offload:
        raise ConfigError(f"schedule {name!r} stashes whole weight versions per stage and "
                          f"steps a replicated optimizer (DDP per stage, as PipeDream and "
                          f"PipeDream-2BW do): zero_stage must be 0 with no fsdp or offload, "
                          f"got zero_stage={zero_stage}, fsdp={fsdp!r}, offload={offload}")


def two_bw_microbatch_rule(pp: int, microbatches: int) -> str | None:
    """PipeDream-2BW's batch: M >= pp microbatches per update."""
    if microbatches < pp:
        return (f"PipeDream-2BW accumulates a batch of M >= pp microbatches per update "
                f"(Narayanan et al. 2021, section 3.1): M must be >= pp={pp}, got {microbatches}")
    return None


def simulated_batches(pp: int, microbatches: int) -> int:
    """K: the batches of M microbatches the program runs (module docstring)."""
    return 2 + math.ceil((pp - 1) / microbatches)


@dataclass(frozen=True)
class AsyncRun:
    """What a Schedule of an asynchronous pipeline carries: its stashing and the M
    microbatches of one iteration (a batch); the program runs `batches` of them."""

    stashing: WeightStashing
    iteration_microbatches: int
    batches: int

    @property
    def update_every(self) -> int:
        return self.stashing.update_every(self.iteration_microbatches)

    def describe(self, pp: int) -> dict:
        """The run's stashing facts, per pipeline rank, for the Timeline's meta."""
        m = self.iteration_microbatches
        return {"rule": self.stashing.rule, "iteration_microbatches": m,
                "simulated_batches": self.batches, "window_batch": WINDOW_BATCH,
                "updates_per_iteration": m // self.update_every,
                "weight_versions": [self.stashing.versions_held(pp, r) for r in range(pp)],
                "staleness": [self.stashing.staleness(pp, r) for r in range(pp)]}


def steady_window(spans: Iterable, run: AsyncRun) -> tuple[float, float]:
    """(start, end) seconds of the reported batch: the ends of rank 0's backwards of
    microbatches M*WINDOW_BATCH - 1 and M*(WINDOW_BATCH + 1) - 1 (stage 0, any layer
    group). `spans`: schedules.timeline.Span-like (rank, lane, op, end)."""
    m = run.iteration_microbatches
    marks = {m * WINDOW_BATCH - 1: None, m * (WINDOW_BATCH + 1) - 1: None}
    for span in spans:
        op = span.op
        if (span.rank == 0 and op.kind is OpKind.B and op.stage == 0
                and op.microbatch in marks):
            end = marks[op.microbatch]
            marks[op.microbatch] = span.end if end is None else max(end, span.end)
    start, end = marks.values()
    if start is None or end is None:
        raise ConfigError(f"the timeline has no backward of stage 0 for microbatch "
                          f"{min(k for k, v in marks.items() if v is None)} on rank 0: the "
                          f"steady-state window of an asynchronous schedule cannot be found")
    return start, end


def summary_line(facts: dict) -> str:
    """The summary's line on the stashing (AsyncRun.describe's facts)."""
    m, rule = facts["iteration_microbatches"], facts["rule"]
    updates = facts["updates_per_iteration"]
    return (f"no flush ({'PipeDream' if rule == PIPEDREAM else 'PipeDream-2BW'}): the "
            f"iteration is the steady state, batch {facts['window_batch']} of "
            f"{facts['simulated_batches']} simulated back to back ({m} microbatches, "
            f"{updates} weight update{'s' if updates != 1 else ''} per stage); weight "
            f"versions held per rank {facts['weight_versions']}, staleness per rank "
            f"{facts['staleness']} updates")
