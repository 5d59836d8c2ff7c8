"""Costs from a calibration profile (schedules.profile) instead of a roofline.

- `ProfileCost`: compute seconds of an op of stage s =
  layers[s] * layer[kind] + (embedding[kind] if s is the first stage)
  + (head[kind] if s is the last stage), the per-layer and extra times the profile
  measured at the model's shapes. One exception, as kernels.executor and
  torch.distributed.pipelining run it: the first stage's input (token ids) needs no
  gradient, so its I is empty (embedding[I] only) and its W is the whole backward
  (layers * layer[B] + embedding[W], plus the head's B if it is also the last stage).
  A profile measured at other shapes is refused. A chunked op (a layer group,
  schedules.layer_groups) costs the layers its group covers, plus the embedding on group
  0 of the first stage and the head on the last group of the last stage; the first-stage
  exception applies to group 0 of stage 0 only (later groups have an input gradient).
  OPT_STEP is refused here: sim.optimizer_cost costs it (from the profile's
  optimizer_seconds_per_param when it has one, wired in sim.cost_model).
- `AlphaBetaNetwork`: the transfer seam (sim.network) with every transfer taking
  alpha + beta * bytes, as measured between two ranks. No contention model: concurrent
  transfers do not slow each other, which holds for the two-rank pipelines it was fitted
  on, and not for many flows sharing a link (use the flow network for that).
- `profile_collective_time`: alpha + beta * bytes of a collective over a group size the
  profile measured; `profile_collective_model` is the replay's collective hook built on
  it (the group's size is the parallel degree of the op's axis; no contention either).

Units: seconds, bytes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import simpy

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_groups import chunk_parts
from clustersim.schedules.layer_kernels import check_kernel_list_used
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import GROUP_AXES, Plan
from clustersim.schedules.profile import PROFILED_KINDS, Profile, shape_mismatch
from clustersim.schedules.recompute import rerun_layers

# OpKind -> the profile's collectives key
COLLECTIVE_NAMES = {OpKind.ALL_REDUCE: "all_reduce", OpKind.ALL_GATHER: "all_gather",
                    OpKind.REDUCE_SCATTER: "reduce_scatter", OpKind.BROADCAST: "broadcast",
                    OpKind.ALL_TO_ALL: "all_to_all", OpKind.REDUCE: "reduce"}


def check_profile(profile: Profile, model: ModelSpec, parallel: ParallelConfig | None = None
                  ) -> None:
    """Raise ConfigError when `profile` was not measured at `model`'s shapes (naming the
    field), or for a parallel layout its per-layer times do not describe."""
    mismatch = shape_mismatch(profile, model)
    if mismatch:
        raise ConfigError(f"profile does not match the model: {mismatch}; recalibrate with "
                          "`clustersim calibrate` at these model flags")
    check_kernel_list_used(model, "a profile's times, measured as they ran,")
    if model.lora:
        raise ConfigError(f"lora_rank={model.lora_rank}: a profile times layers whose every "
                          f"weight trains (calibrate runs no LoRA); price LoRA with the "
                          f"roofline (drop --profile)")
    if parallel is None:
        return
    if parallel.tp != profile.tp:
        raise ConfigError(f"profile was measured at tp={profile.tp}, the run has "
                          f"tp={parallel.tp}: a TP shard's layer time differs")
    if parallel.cp != 1:
        raise ConfigError(f"profile times are for a whole sequence; cp={parallel.cp} splits it")
    if parallel.recompute == "selective":
        raise ConfigError("recompute='selective': the profile has no time for the core "
                          "attention a selective recompute repeats (full recompute is "
                          "priced as one more layer forward)")


class ProfileCost:
    """compute_time(op) from a profile for a pipeline of `layers_per_stage[s]` layers on
    virtual stage s (stage 0 holds the embedding, the last stage the head), each stage
    split into `groups` layer groups for chunked ops. `rerun_layers(positions)`: how many
    of the layers at those positions of a stage a full recompute reruns
    (schedules.recompute.rerun_layers; None: no recompute). The backward of each such
    layer also reruns its forward (one measured layer F more in B, and in I of a split
    backward, which reaches the layers first); K22 Table 4 measured exactly that (19.5 ms =
    11.9 + 7.7 ms less 0.1 for a 22B layer)."""

    def __init__(self, profile: Profile, layers_per_stage: Sequence[int], groups: int = 1,
                 rerun_layers: Callable[[range], int] | None = None, chains: int = 1):
        if not layers_per_stage:
            raise ConfigError("ProfileCost needs at least one stage")
        self.profile = profile
        self.layers = list(layers_per_stage)
        self.table: dict[tuple[int, OpKind, int | None], float] = {}
        model_stages = len(self.layers) // chains  # DualPipe: copies of the model's stages
        for s in range(len(self.layers)):
            for chunk in [None] + (list(range(groups)) if groups > 1 else []):
                parts = chunk_parts(self.layers[:model_stages], s % model_stages, chunk, groups)
                self._add(s, chunk, len(parts.layers), parts.embedding, parts.head,
                          rerun_layers(parts.positions) if rerun_layers else 0)

    def _add(self, s: int, chunk: int | None, layers: int, embedding: bool, head: bool,
             rerun: int) -> None:
        time = self.profile.compute_time
        for k in PROFILED_KINDS:
            self.table[(s, OpKind(k), chunk)] = (
                layers * time("layer", k) + (time("embedding", k) if embedding else 0.0)
                + (time("head", k) if head else 0.0))
        if embedding:  # no input gradient, so I is empty and W is the whole backward
            self.table[(s, OpKind.I, chunk)] = time("embedding", "I")
            self.table[(s, OpKind.W, chunk)] = (
                layers * time("layer", "B") + time("embedding", "W")
                + (time("head", "B") if head else 0.0))
        if rerun:
            redo = rerun * time("layer", "F")
            for k in ("B", "W" if embedding else "I"):
                self.table[(s, OpKind(k), chunk)] += redo

    @staticmethod
    def for_plan(profile: Profile, plan: Plan) -> ProfileCost:
        """The costs of `plan`'s stages and data-parallel layer groups (refused when the
        profile does not describe the plan's model and layout: check_profile)."""
        check_profile(profile, plan.model, plan.parallel)
        return ProfileCost(profile, plan.stage_layers, plan.layer_groups,
                           rerun_layers=partial(rerun_layers, plan.parallel),
                           chains=plan.chains)

    def __call__(self, op: Op) -> float:
        time = self.table.get((op.stage, op.kind, op.chunk))
        if time is None:
            if op.kind.is_compute:
                raise ConfigError(f"the profile has no time for {op.kind.value} ops "
                                  f"(op {op}); it measures F, B, I and W")
            return 0.0
        return time


class AlphaBetaNetwork:
    """Every transfer takes alpha + beta * nbytes seconds (measured; no contention)."""

    def __init__(self, env: simpy.Environment, alpha: float, beta: float):
        if alpha < 0 or beta < 0:
            raise ConfigError(f"alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
        self.env, self.alpha, self.beta = env, alpha, beta

    def transfer(self, src: str, dst: str, nbytes: int) -> simpy.Event:
        return self.env.timeout(self.alpha + self.beta * nbytes)


def profile_collective_time(profile: Profile, op_kind: OpKind | str, group_size: int,
                            nbytes: int) -> float:
    """Seconds of one collective of `nbytes` per rank over `group_size` ranks, from the
    profile's alpha-beta fit (0 for a group of one rank)."""
    if group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {group_size}")
    if group_size == 1:
        return 0.0
    if isinstance(op_kind, OpKind):
        if op_kind not in COLLECTIVE_NAMES:
            raise ConfigError(f"{op_kind.value} is not a collective")
        name = COLLECTIVE_NAMES[op_kind]
    else:
        name = str(op_kind).lower().replace("-", "_")
    return profile.collective(name, group_size).time(nbytes)


def profile_collective_model(env: simpy.Environment, profile: Profile, plan: Plan
                             ) -> Callable[[Op, int], simpy.Event]:
    """The replay's collective hook (sim.engine.Replay): a collective of pipeline rank r
    over axis `op.group` takes profile_collective_time over that group's size
    (Plan.group_size); an op standing for `count` back-to-back collectives pays count of
    them, nbytes / count each."""
    sizes: dict[str | None, int] = {}

    def run(op: Op, pp_rank: int) -> simpy.Event:
        size = sizes.get(op.group)
        if size is None:
            size = sizes[op.group] = plan.group_size(op.group) if op.group in GROUP_AXES else 1
        seconds = op.count * profile_collective_time(profile, op.kind, size,
                                                     op.nbytes // op.count)
        return env.timeout(seconds, value={"model": "measured alpha-beta", "group_size": size})

    return run
