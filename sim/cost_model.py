"""The CostModel protocol: what a simulated run costs, in one object the replay is wired
with (sim.simulate). A cost model gives

- `compute_time(plan, topology)`: seconds of each compute op (F, B, I, W, OPT_STEP);
- `network(env, topology)`: the transfer seam (sim.network) P2P and host copies use;
- `collectives(env, network, plan)`: the replay's collective hook, (op, pipeline rank) ->
  an event that fires when the collective has run;
- `describe()`: one line for the outputs (meta['cost_model']);
- `notes(plan, topology)`: what the run assumed for want of a measurement (run warnings).

Three implementations:
- RooflineCostModel (the default): each compute op is the sum of its kernels' rooflines on
  the device of its stage at that device's measured ceilings x one attainment factor
  (sim.cost), an optimizer step its bytes at the HBM roofline
  (sim.optimizer_cost); transfers and collectives are flows on the topology
  (sim.flows, sim.collective_model);
- UniformCostModel: fixed F and B seconds (I and W half of B), everything else free, for
  checking schedules against their closed forms;
- ProfileCostModel: times measured by `clustersim calibrate` (sim.profile_cost), alpha-beta
  transfers and collectives, no contention.
To add one: a class with these five methods (docs/architecture.md, "Add a cost model").
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import networkx as nx
import simpy

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import check_kernel_list_used
from clustersim.schedules.limits import MAX_OP_SECONDS
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.plan import Plan
from clustersim.schedules.profile import Profile
from clustersim.topologies import DeviceSpec, device_of

from .collective_model import collective_model
from .cost import (ATTAINMENT, RooflineCost, StageKernelCost, assumed_ceiling,
                   attention_note, check_attention_backend, check_fraction, memory_fraction)
from .flows import FlowNetwork
from .attention_table import attention_seconds_of
from .gemm_table import gemm_seconds_of
from .network import InstantNetwork, Network
from .optimizer_cost import offload_options, with_optimizer_steps
from .profile_cost import AlphaBetaNetwork, ProfileCost, profile_collective_model

ComputeTime = Callable[[Op], float]
CollectiveHook = Callable[[Op, int], simpy.Event]


class CostModel(Protocol):
    def compute_time(self, plan: Plan, topology: nx.DiGraph) -> ComputeTime: ...

    def network(self, env: simpy.Environment, topology: nx.DiGraph) -> Network: ...

    def collectives(self, env: simpy.Environment, network: Network, plan: Plan,
                    every_rank: bool = False) -> CollectiveHook: ...

    def describe(self) -> str: ...

    def notes(self, plan: Plan, topology: nx.DiGraph) -> list[str]: ...


def _stage_devices(plan: Plan, topology: nx.DiGraph) -> list[DeviceSpec]:
    """The DeviceSpec of the GPU that holds each stage (its replayed pipeline rank's)."""
    devices = [device_of(topology, d) for d in plan.devices]
    return [devices[rank] for rank in plan.stage_ranks]


@dataclass(frozen=True)
class RooflineCostModel:
    """Per-kernel rooflines (sim.cost): by default at each device's measured ceilings x
    `attainment`; explicit efficiencies (fractions of the datasheet peaks) replace them."""

    compute_efficiency: float | None = None
    memory_efficiency: float | None = None
    attainment: float = ATTAINMENT
    gemm_table: Profile | None = None  # a profile whose measured GEMM and attention times
    # replace those kernels' compute terms where its tables answer (sim.gemm_table,
    # sim.attention_table)
    attention_backend: str = "auto"  # whose published flash-attention speed (sim.cost)

    def __post_init__(self) -> None:
        check_fraction("compute_efficiency", self.compute_efficiency)
        check_fraction("memory_efficiency", self.memory_efficiency)
        check_fraction("attainment", self.attainment)
        check_attention_backend(self.attention_backend, self.compute_efficiency)
        if self.gemm_table is not None and self.gemm_table.gemm is None:
            raise ConfigError("--gemm-table: the profile has no gemm section (calibrate it "
                              "with this version of `clustersim calibrate`)")

    def compute_time(self, plan: Plan, topology: nx.DiGraph) -> ComputeTime:
        devices = _stage_devices(plan, topology)
        self._check_table_dtype(plan.model.dtype)
        if self.attention_backend != "auto" and not plan.model.use_flash_attn:
            raise ConfigError(f"--attention-backend {self.attention_backend} picks a flash "
                              f"attention kernel; this model runs unfused attention "
                              f"(give --use-flash-attn, or drop the flag)")
        measured = gemm_seconds_of(self.gemm_table)
        attention = attention_seconds_of(self.gemm_table)
        by_device: dict[int, RooflineCost] = {}  # one per device: its stages share it
        for d in devices:
            if id(d) not in by_device:
                by_device[id(d)] = RooflineCost(
                    d, plan.model.dtype, self.compute_efficiency, self.memory_efficiency,
                    gemm_seconds=measured, attention_seconds=attention,
                    attainment=self.attainment, attention_backend=self.attention_backend)
        rooflines = [by_device[id(d)] for d in devices]
        return with_optimizer_steps(StageKernelCost(rooflines, plan), devices.__getitem__,
                                    partial(memory_fraction,
                                            memory_efficiency=self.memory_efficiency,
                                            attainment=self.attainment),
                                    **offload_options(plan))

    def _check_table_dtype(self, dtype: str) -> None:
        """A GEMM table answers only GEMMs of its dtype: one of another dtype would price
        none of the model's GEMMs, so it is refused (an fp8 model also runs bf16 GEMMs,
        sim.cost.RooflineCost)."""
        if self.gemm_table is None:
            return
        runs = {dtype, "bf16"} if dtype == "fp8" else {dtype}
        if self.gemm_table.gemm.dtype not in runs:
            raise ConfigError(f"--gemm-table was measured in {self.gemm_table.gemm.dtype}, the "
                              f"model's GEMMs run in {' and '.join(sorted(runs))}: it would "
                              f"price none of them; calibrate with --dtype {dtype}")

    def notes(self, plan: Plan, topology: nx.DiGraph) -> list[str]:
        """What the run assumed for want of a measured ceiling (sim.cost.assumed_ceiling)."""
        notes = []
        if self.gemm_table is not None:
            attention = ("" if self.gemm_table.attention is None else
                         " and attention times at its measured sequence length")
            notes.append(f"GEMM times{attention} from tables measured on "
                         f"{self.gemm_table.device} ({self.gemm_table.gemm.dtype}), applied "
                         f"to every stage's device; shapes they do not surround use the "
                         f"roofline")
        if self.compute_efficiency is not None:
            return notes
        devices = {d.name: d for d in _stage_devices(plan, topology)}
        found = [assumed_ceiling(d, plan.model.dtype) for d in devices.values()]
        if plan.model.use_flash_attn:
            found += [attention_note(d, self.attention_backend) for d in devices.values()]
        return notes + [note for note in found if note]

    def network(self, env: simpy.Environment, topology: nx.DiGraph) -> Network:
        return FlowNetwork(env, topology)

    def collectives(self, env: simpy.Environment, network: Network, plan: Plan,
                    every_rank: bool = False) -> CollectiveHook:
        return collective_model(env, network, plan, every_rank)

    def describe(self) -> str:
        compute = (f"compute_efficiency={self.compute_efficiency}"
                   if self.compute_efficiency is not None
                   else f"compute: device matmul ceiling x attainment {self.attainment}")
        memory = (f"memory_efficiency={self.memory_efficiency}"
                  if self.memory_efficiency is not None
                  else f"memory: device HBM ceiling x attainment {self.attainment}")
        table = (f", GEMMs from the table measured on {self.gemm_table.device}"
                 if self.gemm_table is not None else "")
        attention = ("" if self.compute_efficiency is not None
                     else ", attention: published speed of " + (
                         "each device's default kernel (auto)" if self.attention_backend == "auto"
                         else f"the {self.attention_backend} kernel"))
        return f"roofline({compute}, {memory}{attention}{table})"


@dataclass(frozen=True)
class UniformCostModel:
    """`forward` and `backward` seconds per op of one virtual stage on one microbatch (I
    and W take half of the backward each); communication and optimizer steps are free.
    An op split into the data-parallel pass's G layer groups (Op.chunk) takes 1/G of the
    whole op, so the closed forms hold with any data parallelism."""

    forward: float
    backward: float

    def __post_init__(self) -> None:
        for name, value in (("forward", self.forward), ("backward", self.backward)):
            if not 0 <= value <= MAX_OP_SECONDS:
                raise ConfigError(f"uniform cost {name} must be a number of seconds in [0, "
                                  f"{MAX_OP_SECONDS:g}] (finite: an op of a real iteration), "
                                  f"got {value}")
        if self.forward == self.backward == 0:
            raise ConfigError("uniform costs: forward and backward both 0 s leave an iteration "
                              "of no time, whose throughput has no value: give one > 0")

    def seconds(self, op: Op) -> float:
        if op.kind is OpKind.F:
            return self.forward
        if op.kind is OpKind.B:
            return self.backward
        if op.kind in (OpKind.I, OpKind.W):
            return self.backward / 2
        return 0.0

    def compute_time(self, plan: Plan, topology: nx.DiGraph) -> ComputeTime:
        check_kernel_list_used(plan.model, "--uniform-costs' fixed seconds")
        groups = plan.layer_groups

        def seconds(op: Op) -> float:
            whole = self.seconds(op)
            return whole if op.chunk is None else whole / groups

        return seconds

    def network(self, env: simpy.Environment, topology: nx.DiGraph) -> Network:
        return InstantNetwork(env)

    def collectives(self, env: simpy.Environment, network: Network, plan: Plan,
                    every_rank: bool = False) -> CollectiveHook:
        return lambda op, pp_rank: env.timeout(0, value=None)

    def describe(self) -> str:
        return "uniform"

    def notes(self, plan: Plan, topology: nx.DiGraph) -> list[str]:
        return []


def parse_uniform_costs(text: str) -> UniformCostModel:
    """`"F,B"` in seconds, e.g. `"1,2"`."""
    try:
        forward, backward = (float(p) for p in text.split(","))
    except ValueError:
        raise ConfigError(
            f"--uniform-costs must be two numbers of seconds 'F,B' such as '1,2', got {text!r}"
        ) from None
    return UniformCostModel(forward, backward)


@dataclass(frozen=True)
class ProfileCostModel:
    """Measured compute, P2P and collective times of a calibration profile; an optimizer
    step from the profile's seconds per parameter, or (an older profile without it) at
    the HBM roofline with `memory_efficiency`."""

    profile: Profile
    memory_efficiency: float | None = None  # None: the device's HBM ceiling x attainment

    def __post_init__(self) -> None:
        check_fraction("memory_efficiency", self.memory_efficiency)

    def compute_time(self, plan: Plan, topology: nx.DiGraph) -> ComputeTime:
        return with_optimizer_steps(ProfileCost.for_plan(self.profile, plan),
                                    _stage_devices(plan, topology).__getitem__,
                                    partial(memory_fraction,
                                            memory_efficiency=self.memory_efficiency),
                                    gpu_seconds_per_param=self.profile.optimizer_seconds_per_param,
                                    **offload_options(plan))

    def network(self, env: simpy.Environment, topology: nx.DiGraph) -> Network:
        return AlphaBetaNetwork(env, self.profile.p2p.alpha, self.profile.p2p.beta)

    def collectives(self, env: simpy.Environment, network: Network, plan: Plan,
                    every_rank: bool = False) -> CollectiveHook:
        return profile_collective_model(env, self.profile, plan)  # by group size alone

    def describe(self) -> str:
        return f"profile({self.profile.device})"

    def notes(self, plan: Plan, topology: nx.DiGraph) -> list[str]:
        return []
