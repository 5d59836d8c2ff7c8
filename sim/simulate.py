"""One call from (schedule, model, parallel config, topology) to a simulated Timeline.

Steps: build or take the schedule -> check its structure -> cost
every op from the ModelSpec -> place pipeline ranks on GPUs in the config's rank order ->
replay it in SimPy with a cost model and the network seam. A deadlock found by the replay
is re-reported through the unit-time dry run, whose rank x step grid marks the stuck ops.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx
import simpy

from schedules.annotate import annotate
from schedules.data_parallel import add_dp_allreduce
from schedules.costs import stage_costs
from schedules.errors import ConfigError, DeadlockError
from schedules.generators import build_schedule
from schedules.model import ModelSpec
from schedules.ops import Op
from schedules.parallel import ParallelConfig
from schedules.profile import Profile
from schedules.schedule import Schedule
from schedules.timeline import Timeline
from schedules.validate import check_structure, dry_run
from topologies import device_of, gpu_nodes

from .cost import DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEMORY_EFFICIENCY, RooflineCost, UniformCost
from .collectives import run_collective
from .engine import Replay
from .memory import memory_model
from .profile_cost import AlphaBetaNetwork, ProfileCost, profile_collective_model
from .flows import FlowNetwork
from .network import InstantNetwork

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CostOptions:
    """How compute is costed: `uniform` fixes F/B seconds (and zero-cost communication);
    `profile` uses measured times and alpha-beta P2P (sim.profile_cost); otherwise a
    roofline with these efficiencies."""

    uniform: UniformCost | None = None
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY
    profile: Profile | None = None  # measured times (sim.profile_cost); overrides the roofline


def pipeline_devices(parallel: ParallelConfig, topology: nx.DiGraph) -> list[str]:
    """GPU node of each pipeline rank of the first replica (dp = tp = cp = 0)."""
    gpus = gpu_nodes(topology)
    if parallel.world_size > len(gpus):
        raise ConfigError(
            f"the parallel config needs {parallel.world_size} GPUs (tp*cp*dp*pp), topology "
            f"{topology.graph.get('name', '?')!r} has {len(gpus)}")
    return [gpus[parallel.rank(pp=r)] for r in range(parallel.pp)]


def tp_groups_spanning_hosts(parallel: ParallelConfig, topology: nx.DiGraph) -> list[list[int]]:
    """TP groups (global ranks) whose GPUs sit on more than one host: their all-reduces
    would cross the inter-node network, which Megatron's layouts avoid."""
    gpus = gpu_nodes(topology)
    spanning, seen = [], set()
    for rank in range(parallel.world_size):
        group = tuple(parallel.group("tp", rank))
        if group in seen:
            continue
        seen.add(group)
        if len({topology.nodes[gpus[g]]["host"] for g in group}) > 1:
            spanning.append(list(group))
    return spanning


def collective_model(env: simpy.Environment, network, parallel: ParallelConfig,
                     topology: nx.DiGraph) -> Callable[[Op, int], simpy.Event]:
    """How the replay runs a collective of pipeline rank r: over the GPUs of r's group
    (`op.group` axis of the rank grid) on the flow network; instant on InstantNetwork."""
    gpus = gpu_nodes(topology)

    def run(op: Op, pp_rank: int) -> simpy.Event:
        if not isinstance(network, FlowNetwork):
            return env.timeout(0, value=None)
        group = parallel.group(op.group, parallel.rank(pp=pp_rank))
        me = group.index(parallel.rank(pp=pp_rank))
        result = env.event()
        running = run_collective(env, network, op, [gpus[g] for g in group], ranks=group)
        running.callbacks.append(lambda ev: result.succeed(dict(ev.value.spans[me].info)))
        return result

    return run


def simulate(model: ModelSpec, parallel: ParallelConfig, topology: nx.DiGraph,
             schedule: Schedule | None = None, costs: CostOptions = CostOptions()) -> Timeline:
    """Simulate one training iteration; `schedule` overrides the one `parallel` names."""
    parallel.check_model(model)
    if schedule is None:
        schedule = build_schedule(parallel.schedule, parallel.pp, parallel.num_microbatches,
                                  parallel.vpp)
    elif schedule.num_ranks != parallel.pp:
        raise ConfigError(f"schedule {schedule.name!r} has {schedule.num_ranks} ranks, "
                          f"pp is {parallel.pp}")
    check_structure(schedule)
    if parallel.dp > 1:
        schedule = add_dp_allreduce(schedule)
    per_stage = stage_costs(model, parallel, schedule.num_stages)
    lowered = annotate(schedule, per_stage)
    devices = pipeline_devices(parallel, topology)

    env = simpy.Environment()
    if costs.uniform is not None:
        compute_time, network = costs.uniform, InstantNetwork(env)
    elif costs.profile is not None:
        compute_time = ProfileCost.for_model(costs.profile, model, parallel, schedule.num_stages)
        network = AlphaBetaNetwork(env, costs.profile.p2p.alpha, costs.profile.p2p.beta)
    else:
        rooflines = [RooflineCost(device_of(topology, d), model.dtype, costs.compute_efficiency,
                                  costs.memory_efficiency) for d in devices]
        ranks = schedule.stage_ranks

        def compute_time(op):
            return rooflines[ranks[op.stage]](op)

        network = FlowNetwork(env, topology)
    collective = (profile_collective_model(env, costs.profile, parallel) if costs.profile
                  else collective_model(env, network, parallel, topology))
    replay = Replay(env, lowered, devices, compute_time, network,
                    memory_model(lowered, per_stage), collective)
    try:
        timeline = replay.run()
    except DeadlockError:
        dry_run(schedule)  # re-raises with the rank x step grid
        raise

    warnings = []
    capacity = device_of(topology, devices[0]).memory_bytes
    over = [r for r, peak in timeline.peak_memory().items() if peak > capacity]
    if over:
        warnings.append(f"ranks {over} exceed the device memory of {capacity / 1e9:.0f} GB")
    spanning = tp_groups_spanning_hosts(parallel, topology)
    if spanning:
        warnings.append(f"{len(spanning)} TP group(s) span several nodes, e.g. ranks "
                        f"{spanning[0]}: TP traffic would cross the inter-node network")
    for warning in warnings:
        log.info(warning)
    timeline.meta.update({
        "schedule": schedule.name, "pp": parallel.pp, "vpp": schedule.stages_per_rank,
        "dp": parallel.dp, "tp": parallel.tp, "microbatches": schedule.num_microbatches,
        "model": model.name or "custom", "topology": topology.graph.get("name", "custom"),
        "devices": devices, "device_memory_bytes": capacity, "oom_ranks": over,
        "warnings": warnings,
        "cost_model": "uniform" if costs.uniform else
        f"profile({costs.profile.device})" if costs.profile else
        f"roofline(compute_efficiency={costs.compute_efficiency}, "
        f"memory_efficiency={costs.memory_efficiency})",
    })
    return timeline
