"""One call from (model, parallel config, topology[, schedule], cost model) to a simulated
Timeline; the wiring of the parts, nothing more:

1. resolve the Plan (schedules.plan) from the model, the config, the topology's cluster
   facts (sim.cluster) and the schedule's shape;
2. lower the schedule (schedules.lowering: structure check, data parallel, P2P, costs,
   intra-layer collectives);
3. replay it in SimPy (sim.engine) on the replayed GPUs of the plan, with the cost
   model's compute times, network and collective hook (sim.cost_model), the memory
   model (sim.memory) and the slowdown of compute beside data-parallel collectives
   (sim.collective_model.compute_slowdowns); host copies (ZeRO-Offload's, ZeRO-R
   Pa+cpu's checkpoints) go over the GPU's PCIe link to its host CPU (sim.offload);
4. describe the run in the Timeline's meta: the plan, the cost model, warnings, the OOM
   report.
A deadlock found by the replay is re-reported through the unit-time dry run, whose rank x
step grid marks the stuck ops. Steps 2-4 are `prepare_replay` (a PreparedReplay: lower,
notes; `replay` builds the engine on a given environment and network; `describe`), so
several jobs can share one network (sim.shared_fabric); `gpus` places a run's ranks on
some of the topology's GPUs (sim.cluster). docs/architecture.md, "The simulator".
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import simpy

from clustersim.schedules.data_parallel import gradient_dtype_notes
from clustersim.schedules.errors import DeadlockError
from clustersim.schedules.fp8 import check_fp8_device, fp8_notes
from clustersim.schedules.limits import MAX_OPS
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ep_comms import PAIR_COMM_SMS, pair_hides_experts
from clustersim.schedules.names import TP
from clustersim.schedules.ops import COPY_KINDS, overlapped_pairs
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import Plan, resolve
from clustersim.schedules.registry import schedule_entry
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.single_process_dp import check_one_host, single_process_notes
from clustersim.schedules.tp_grid import tp_grid_notes
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.validate import dry_run
from clustersim.schedules.weight_stashing import steady_window
from clustersim.topologies import device_of

from .auto_schedule import build_auto_schedule
from .cluster import cluster_facts
from .collective_model import compute_slowdowns
from .cost_model import CostModel, RooflineCostModel
from .engine import MemoryModel, Replay, ReplayRanks
from .memory import memory_model, oom_report
from .network import Network
from .offload import host_cpus, with_host_links
from .throughput import throughput
from .waits import waited_for, waits_note
from .world import Replaying, World

log = logging.getLogger(__name__)


def simulate(model: ModelSpec, parallel: ParallelConfig, topology: nx.DiGraph,
             schedule: Schedule | None = None,
             costs: CostModel = RooflineCostModel(), max_ops: int = MAX_OPS,
             replaying: Replaying = Replaying(), gpus: Sequence[str] | None = None
             ) -> Timeline:
    """Simulate one training iteration; `schedule` (a custom one, given as data)
    overrides the registered schedule `parallel` names; `max_ops`: the op budget of a
    registered schedule (schedules.limits), checked before it is built; `replaying`:
    which ranks to replay and which GPUs are slow (sim.world); `gpus`: the GPU nodes
    rank 0, 1, ... run on (default: the topology's, in index order)."""
    return simulate_schedule(model, parallel, topology, schedule, costs, max_ops,
                             replaying, gpus)[1]


def simulate_schedule(model: ModelSpec, parallel: ParallelConfig, topology: nx.DiGraph,
                      schedule: Schedule | None = None,
                      costs: CostModel = RooflineCostModel(), max_ops: int = MAX_OPS,
                      replaying: Replaying = Replaying(), gpus: Sequence[str] | None = None
                      ) -> tuple[Schedule, Timeline]:
    """`simulate`, and the compute-only schedule it replayed (the registered one, the
    one given, or zb-auto's order built for this run's costs)."""
    if schedule is None and schedule_entry(parallel.schedule).built_from_costs:
        return _simulate_auto(model, parallel, topology, costs, max_ops, replaying, gpus)
    plan = checked_plan(model, parallel, topology, schedule, max_ops, gpus)
    schedule = schedule or plan.build_schedule()
    return schedule, _replay(plan, topology, costs, schedule, replaying)


def checked_plan(model: ModelSpec, parallel: ParallelConfig, topology: nx.DiGraph,
                 schedule: Schedule | None, max_ops: int,
                 gpus: Sequence[str] | None = None) -> Plan:
    """The run's Plan on `topology` (on its GPU nodes `gpus`, rank g on gpus[g], when
    given), checked before any work: a GPU for every rank, FP8 on its devices, one host
    for single-process data parallelism."""
    plan = resolve(model, parallel, cluster_facts(topology, gpus), schedule, max_ops)
    plan.devices  # every rank needs a GPU (ConfigError otherwise), checked before any work
    for device in {device_of(topology, gpu) for gpu in plan.devices}:
        check_fp8_device(model, device.name, device.compute_capability)
    check_one_host(plan)
    return plan


def _simulate_auto(model: ModelSpec, parallel: ParallelConfig, topology: nx.DiGraph,
                   costs: CostModel, max_ops: int, replaying: Replaying,
                   gpus: Sequence[str] | None) -> tuple[Schedule, Timeline]:
    """A schedule built from this run's simulated costs (sim.auto_schedule), replayed."""
    def simulate_with(schedule: Schedule) -> tuple[Plan, Timeline, tuple[int, ...]]:
        plan = checked_plan(model, parallel, topology, schedule, max_ops, gpus)
        job = prepare_replay(plan, topology, costs, schedule, replaying)
        return plan, _run_prepared(job), job.world.programs

    schedule, note = build_auto_schedule(parallel, simulate_with)
    plan, timeline, _ = simulate_with(schedule)
    log.info(note)
    timeline.meta["warnings"].append(note)
    return schedule, timeline


def pair_note(pairs: int, hides_experts: bool) -> str:
    """What the run assumed of DualPipe's overlapped forward-backward pairs."""
    head = (f"{pairs} overlapped forward-backward pairs (DualPipe's F&B, torch's OVERLAP_F_B) "
            f"run F then B")
    if hides_experts:
        return (f"{head}, both ops' expert all-to-alls beside the pair on {PAIR_COMM_SMS} "
                f"SMs, the compute on the rest (DeepSeek-V3 report sections 3.2.1, 3.5.1): "
                f"max(F + B, all-to-alls) per pair; how DeepSeek interleaves the two chunks' "
                f"components is not modelled")
    return (f"{head}; with no expert all-to-alls to hide they gain nothing from running at "
            f"once (DeepSeek-V3 report section 3.2.1)")


def _replay(plan: Plan, topology: nx.DiGraph, costs: CostModel,
            schedule: Schedule | None, replaying: Replaying = Replaying()) -> Timeline:
    """Lower `schedule` (default: the plan's registered schedule) and replay it on
    `topology`, the one the plan's cluster facts were read from: one pipeline replica,
    or every rank (sim.world)."""
    return _run_prepared(prepare_replay(plan, topology, costs, schedule, replaying))


def _run_prepared(job: PreparedReplay) -> Timeline:
    """Replay a prepared run on a network of its own; its Timeline, described."""
    env = simpy.Environment()
    replay = job.replay(env, job.costs.network(env, job.topology))
    try:
        timeline = replay.run()
    except DeadlockError:
        dry_run(job.lowered)  # re-raises with the rank x step grid
        raise
    return job.describe(timeline)


@dataclass
class PreparedReplay:
    """One run lowered and ready to replay on a network that `_replay` builds, or that
    several runs share (sim.shared_fabric): `_replay` in three steps, prepare (lower,
    choose the replayed ranks, the notes), `replay` (the engine on an environment and a
    network), `describe` (the Timeline's meta)."""

    plan: Plan
    topology: nx.DiGraph  # with host CPUs and PCIe links when the schedule copies to them
    costs: CostModel
    replaying: Replaying
    world: World
    lowered: Schedule
    warnings: list[str]
    breakdown: list  # rank_memory of the plan: static bytes per pipeline rank

    def replay(self, env: simpy.Environment, network: Network) -> Replay:
        """The engine replaying this run on `network` in `env` (not yet run)."""
        plan, topology, costs, world = self.plan, self.topology, self.costs, self.world
        devices = world.devices
        memory = memory_model(self.lowered, plan, self.breakdown)
        slowdown = compute_slowdowns(plan, topology)
        ranks = None
        if world.full:  # per pipeline rank -> per replayed rank
            memory = MemoryModel([memory.static[p] for p in world.programs],
                                 memory.activations, memory.gathered)
            slowdown = [slowdown[p] for p in world.programs]
            slow = self.replaying.factors(plan.world_size)
            ranks = ReplayRanks(world.programs, world.replicas, world.members,
                                [slow.get(r, 1.0) for r in world.ranks] if slow else None)
        return Replay(env, self.lowered, devices, costs.compute_time(plan, topology), network,
                      memory, costs.collectives(env, network, plan, world.full),
                      host_cpus(list(devices), topology), slowdown=slowdown, ranks=ranks)

    def describe(self, timeline: Timeline) -> Timeline:
        """`timeline` (the replay's) with the run described in its meta."""
        plan, topology, world = self.plan, self.topology, self.world
        warnings = list(self.warnings)  # a prepared run may be replayed more than once
        run = self.lowered.asynchronous
        if run is not None:  # the reported iteration is the steady state's window
            start, end = steady_window(timeline.spans, run)
            timeline.meta["steady_state"] = {"start": start, "end": end,
                                             **run.describe(plan.pp)}
        capacity = plan.cluster.memory_bytes
        over = [r for r, peak in timeline.peak_memory().items() if peak > capacity]
        if over:
            warnings.append(f"ranks {over} exceed the device memory of "
                            f"{capacity / 1e9:.1f} GB")
        spanning = plan.groups_spanning_hosts(TP)
        if spanning:
            warnings.append(f"{len(spanning)} TP group(s) span several nodes, e.g. ranks "
                            f"{spanning[0]}: TP collectives cross the inter-node network "
                            "(simulated as flows)")
        for warning in warnings:
            log.info(warning)
        if world.full:
            timeline.meta["waited_for"] = waited = waited_for(timeline.spans)
            note = waits_note(waited)
            warnings += [note] if note else []
        replayed = (plan.replay_statement() if not world.full else
                    f"all {plan.world_size} GPUs replayed op by op, each collective run once "
                    f"its group's members have all posted it (--replay all)")
        timeline.meta.update({"plan": plan.describe(), "replayed": replayed,
                              "cost_model": self.costs.describe(),
                              "throughput": throughput(plan, timeline.iteration_time,
                                                       device_of(topology, world.devices[0])),
                              "warnings": warnings, "oom_ranks": over,
                              "oom": oom_report(timeline, self.breakdown, capacity)})
        return timeline


def prepare_replay(plan: Plan, topology: nx.DiGraph, costs: CostModel,
                   schedule: Schedule | None, replaying: Replaying = Replaying()
                   ) -> PreparedReplay:
    """Lower `schedule` (default: the plan's registered schedule) for a replay on
    `topology`, choose the replayed ranks (sim.world) and gather the run's notes."""
    world, why = replaying.world(plan, topology)
    schedule = schedule or plan.build_schedule()
    lowered = lower(schedule, plan)
    warnings = (costs.notes(plan, topology)
                + fp8_notes(plan.model, plan.parallel.sequence_parallel)
                + single_process_notes(plan) + tp_grid_notes(plan.parallel)
                + gradient_dtype_notes(plan)
                + ([why] if why else []))
    pairs = sum(len(overlapped_pairs(program)) for program in schedule.programs)
    if pairs:
        warnings.append(pair_note(pairs, pair_hides_experts(plan.model, plan.parallel)))
    if any(op.kind in COPY_KINDS for op in lowered.ops()):  # ZeRO-Offload's, Pa+cpu's
        topology, assumed = with_host_links(topology)
        warnings += [assumed] if assumed else []
    breakdown = rank_memory(plan, in_flight=[0] * plan.num_stages)
    return PreparedReplay(plan, topology, costs, replaying, world, lowered, warnings,
                          breakdown)
