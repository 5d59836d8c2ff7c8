"""The ranks a replay runs: one pipeline replica (the symmetric replay) or every rank of
the job (the full replay, `--replay all`).

Replay index i (what sim.engine calls a rank) is global rank `ranks[i]`. It runs the
program of its pipeline coordinate (`programs[i]`: the lowered schedule has one program
per pipeline rank) on GPU `devices[i]`. Keyed completions (schedules.contract's (kind,
stage, microbatch) keys) are per replica (`replicas[i]`: the ranks of one pipeline, equal
in every coordinate but pp), so a SEND_F pairs with the RECV_F of its own replica. A
collective whose group has other replayed members waits until all of them have posted it
and runs once for them all (`members`): in the full replay every member of its group; in
the symmetric replay only DualPipe's two stage copies (group 'pp_copies'), the other
members being the other replicas, which by symmetry post it at the same moment.
Matching: members at one pipeline coordinate run one program, so the n-th collective each
issues on the group's lane is the same op; 'pp_copies' pairs the two copies' ops by key
(schedules.contract.copy_peer).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.names import PP, PP_COPIES
from clustersim.schedules.ops import Op
from clustersim.schedules.plan import Plan

from .symmetry import device_mismatch, link_asymmetry, placement_asymmetry


@dataclass(frozen=True)
class World:
    """The replayed ranks of `plan` (module docstring): `full` = every rank."""

    plan: Plan
    full: bool = False
    ranks: tuple[int, ...] = field(init=False)
    programs: tuple[int, ...] = field(init=False)
    replicas: tuple[int, ...] = field(init=False)
    index_of: dict[int, int] = field(init=False, repr=False)
    _groups: dict[tuple[int, str], tuple[int, ...]] = field(init=False, repr=False,
                                                            compare=False)

    def __post_init__(self) -> None:
        plan, parallel = self.plan, self.plan.parallel
        ranks = tuple(range(plan.world_size)) if self.full else plan.replayed_ranks
        first: dict[int, int] = {}  # a replica's first global rank -> its replica index
        replicas = tuple(first.setdefault(plan.group(PP, r)[0], len(first)) for r in ranks)
        set_ = object.__setattr__
        set_(self, "ranks", ranks)
        set_(self, "programs", tuple(parallel.coords(r)[PP] for r in ranks))
        set_(self, "replicas", replicas)
        set_(self, "index_of", {r: i for i, r in enumerate(ranks)})
        set_(self, "_groups", {})  # (replay rank, group) -> members: asked per collective

    @property
    def devices(self) -> tuple[str, ...]:
        """GPU node of each replayed rank."""
        self.plan.cluster.check_fits(self.plan.world_size)
        gpus = self.plan.cluster.gpus
        return tuple(gpus[r] for r in self.ranks)

    def members(self, index: int, op: Op) -> tuple[int, ...]:
        """Replay indices of the replayed members of `op`'s group for replay rank `index`
        (itself included, ascending): those that meet before the collective runs."""
        if op.group != PP_COPIES and not (self.full and op.group is not None):
            return (index,)
        key = (index, op.group)
        hit = self._groups.get(key)
        if hit is None:
            group = self.plan.group(op.group, self.ranks[index])
            hit = self._groups[key] = tuple(sorted(self.index_of[r] for r in group
                                                   if r in self.index_of))
        return hit


REPLAY_MODES = ("auto", "symmetric", "all")


SPREADS = {"lognormal": ("sigma",), "uniform": ("low", "high")}
"""Distributions GPU speeds may be drawn from (GpuSpread) and their parameters."""


@dataclass(frozen=True)
class GpuSpread:
    """Every GPU's compute-time factor drawn independently: 'lognormal' exp(N(0, sigma^2))
    (median 1; sigma 0.05 puts 95% of GPUs within about +-10%), or 'uniform' on [low,
    high]; numpy's default_rng(seed), one draw per global rank in rank order, so a run
    repeats."""

    distribution: str
    params: tuple[float, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        names = SPREADS.get(self.distribution)
        if names is None:
            raise ConfigError(f"GPU spread {self.distribution!r}: must be one of "
                              f"{', '.join(SPREADS)}")
        if len(self.params) != len(names):
            raise ConfigError(f"GPU spread {self.distribution}: takes {', '.join(names)}")
        if self.distribution == "lognormal" and not 0 < self.params[0] <= 1:
            raise ConfigError(f"GPU spread lognormal: sigma {self.params[0]!r} must be in "
                              f"(0, 1] (0 would change nothing)")
        if self.distribution == "uniform":
            low, high = self.params
            if not 0 < low < high:
                raise ConfigError(f"GPU spread uniform: needs 0 < low < high, got {low}, "
                                  f"{high}")

    def factors(self, world_size: int) -> list[float]:
        """The factor of each global rank 0 .. world_size - 1."""
        import numpy as np

        rng = np.random.default_rng(self.seed)
        if self.distribution == "lognormal":
            drawn = rng.lognormal(0.0, self.params[0], world_size)
        else:
            drawn = rng.uniform(*self.params, world_size)
        return [float(x) for x in drawn]

    def describe(self) -> str:
        values = ", ".join(f"{n}={v:g}" for n, v in zip(SPREADS[self.distribution],
                                                        self.params))
        return f"{self.distribution}({values}, seed {self.seed})"


@dataclass(frozen=True)
class Replaying:
    """How to replay a job: `mode` 'symmetric' (one pipeline replica; refused when the
    job or cluster is not symmetric), 'all' (every rank) or 'auto' (symmetric unless
    something breaks the symmetry, then every rank, saying why); `slow_gpus`: global
    rank -> factor its compute ops take longer (a straggler: 1.5 = 50% slower);
    `spread`: every GPU's factor drawn from a distribution (GpuSpread), `slow_gpus`
    overriding the draws of their ranks."""

    mode: str = "auto"
    slow_gpus: tuple[tuple[int, float], ...] = ()
    spread: GpuSpread | None = None

    def __post_init__(self) -> None:
        if self.mode not in REPLAY_MODES:
            raise ConfigError(f"replay={self.mode!r} must be one of {', '.join(REPLAY_MODES)}")
        for rank, factor in self.slow_gpus:
            if not (isinstance(factor, (int, float)) and factor > 0 and factor != 1):
                raise ConfigError(f"slow GPU {rank}: factor {factor!r} must be a number > 0 "
                                  f"other than 1 (how many times longer its compute takes; "
                                  f"1 would change nothing)")

    def factors(self, world_size: int) -> dict[int, float]:
        """Global rank -> its compute-time factor (ranks at 1 left out)."""
        drawn = (dict(enumerate(self.spread.factors(world_size)))
                 if self.spread is not None else {})
        drawn.update(self.slow_gpus)
        return {rank: k for rank, k in drawn.items() if k != 1}

    def world(self, plan: Plan, topology: nx.DiGraph) -> tuple[World, str | None]:
        """The replayed ranks, and a note when 'auto' replays every rank (why)."""
        for rank, _ in self.slow_gpus:
            if not (isinstance(rank, int) and 0 <= rank < plan.world_size):
                raise ConfigError(f"slow GPU {rank!r}: not a rank of the job (0.."
                                  f"{plan.world_size - 1})")
        mixed = device_mismatch(plan, topology)
        if mixed:
            raise ConfigError(f"{mixed}: compute is costed on each pipeline stage's device, so "
                              f"a GPU of another device is modelled by neither replay (slow "
                              f"one GPU with --slow-gpu RANK=FACTOR instead)")
        reason = self._asymmetry(plan, topology)
        if self.mode == "symmetric" and reason:
            raise ConfigError(f"replay='symmetric' replays one pipeline replica, but {reason}: "
                              f"replay every rank (--replay all)")
        if self.mode == "all" or reason:
            note = None if self.mode == "all" else f"every rank replayed because {reason}"
            return World(plan, full=True), note
        return World(plan), None

    def _asymmetry(self, plan: Plan, topology: nx.DiGraph) -> str | None:
        """Why the symmetric replay would not see this job as it is, or None."""
        if self.spread is not None:
            factors = self.factors(plan.world_size)
            slowest = max(factors, key=factors.get)
            return (f"GPU speeds are drawn from {self.spread.describe()}: factors "
                    f"{min(factors.values()):.3g}..{factors[slowest]:.3g}, slowest GPU "
                    f"{slowest}")
        if self.slow_gpus:
            return "GPU " + ", ".join(f"{r} runs {k:g}x slower" for r, k in self.slow_gpus)
        faults = topology.graph.get("faults")
        if faults:
            return "the topology has faults (" + "; ".join(faults) + ")"
        return link_asymmetry(plan, topology) or placement_asymmetry(plan)
