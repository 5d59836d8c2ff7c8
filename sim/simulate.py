"""One call from (schedule, model, parallel config, topology) to a simulated Timeline.

Steps: build or take the schedule -> check its structure -> add the data-parallel
communication the config asks for (schedules.data_parallel: DDP buckets, ZeRO 1-3,
FSDP/HSDP, ZeRO++, offload) -> cost every op from the ModelSpec (layer groups from
schedules.layer_groups) -> add the intra-layer TP/SP/CP/EP/ETP collectives
(schedules.intra_layer: the config's intra-layer fields, or an explicit IntraLayerOptions)
-> place pipeline ranks on GPUs in the config's rank order -> replay it in SimPy with a
cost model (optimizer steps: sim.optimizer_cost, per measured parameter when the profile has
it) and the network seam (collectives: sim.collective_model; host copies over the GPU's
PCIe link to its host CPU). A deadlock found by the replay is re-reported through the
unit-time dry run, whose rank x step grid marks the stuck ops.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx
import simpy

from clustersim.schedules.annotate import annotate
from clustersim.schedules.data_parallel import add_data_parallel
from clustersim.schedules.layer_groups import group_costs
from clustersim.schedules.costs import stage_costs
from clustersim.schedules.errors import ConfigError, DeadlockError
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.intra_layer import IntraLayerOptions, add_intra_layer
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.profile import Profile
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.validate import check_structure, dry_run
from clustersim.topologies import device_of, gpu_nodes

from .cost import (DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEMORY_EFFICIENCY, RooflineCost,
                   StageKernelCost, UniformCost)
from .collective_model import collective_model
from .dp_groups import group_size, shard_size
from .offload import host_cpus, with_host_links
from .optimizer_cost import with_optimizer_steps
from .engine import Replay
from .memory import gpus_per_node, memory_model
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


def gathered_bytes(model: ModelSpec, parallel: ParallelConfig) -> Callable[[Op], int]:
    """Bytes a ZeRO-3 / FSDP parameter gather (chunk set) holds until its last user ends:
    the layer group's unsharded 16-bit parameters, i.e. its nbytes, or for a ZeRO++ qwZ
    int8 gather (group 'dp', one byte per parameter) nbytes * dtype bytes once dequantized.
    ZeRO-1/2 gathers (chunk None) refill always-resident parameters: nothing extra."""
    scale = model.dtype_bytes if parallel.quantized_weights else 1

    def held(op: Op) -> int:
        if op.chunk is None:
            return 0
        return op.nbytes * (scale if op.group == "dp" else 1)

    return held


def simulate(model: ModelSpec, parallel: ParallelConfig, topology: nx.DiGraph,
             schedule: Schedule | None = None, costs: CostOptions = CostOptions(),
             intra: IntraLayerOptions | None = None) -> Timeline:
    """Simulate one training iteration; `schedule` overrides the one `parallel` names;
    `intra` says how TP/CP/EP communication runs (schedules.intra_layer), overriding the
    config's intra-layer fields (default: IntraLayerOptions.from_parallel(parallel))."""
    parallel.check_model(model)
    if intra is None:
        intra = IntraLayerOptions.from_parallel(parallel)
    if schedule is None:
        schedule = build_schedule(parallel.schedule, parallel.pp, parallel.num_microbatches,
                                  parallel.vpp)
    elif schedule.num_ranks != parallel.pp:
        raise ConfigError(f"schedule {schedule.name!r} has {schedule.num_ranks} ranks, "
                          f"pp is {parallel.pp}")
    check_structure(schedule)
    devices = pipeline_devices(parallel, topology)
    shard = shard_size(parallel, topology)
    schedule = add_data_parallel(schedule, model, parallel, shard)
    per_stage = stage_costs(model, parallel, schedule.num_stages)
    chunk_costs = (group_costs(model, parallel, schedule.num_stages, schedule.layer_groups)
                   if schedule.layer_groups > 1 else None)
    lowered = add_intra_layer(annotate(schedule, per_stage, chunk_costs), model, parallel,
                              intra)
    host_warning = None
    if parallel.offload:
        topology, host_warning = with_host_links(topology)
    hosts = host_cpus(devices, topology)

    env = simpy.Environment()
    if costs.uniform is not None:
        compute_time, network = costs.uniform, InstantNetwork(env)
    elif costs.profile is not None:
        compute_time = ProfileCost.for_model(costs.profile, model, parallel, schedule.num_stages,
                                             schedule.layer_groups)
        network = AlphaBetaNetwork(env, costs.profile.p2p.alpha, costs.profile.p2p.beta)
    else:
        rooflines = [RooflineCost(device_of(topology, d), model.dtype, costs.compute_efficiency,
                                  costs.memory_efficiency) for d in devices]
        compute_time = StageKernelCost([rooflines[r] for r in schedule.stage_ranks], per_stage,
                                       chunk_costs)

        network = FlowNetwork(env, topology)
    if schedule.count(OpKind.OPT_STEP):  # (a wrapper per compute op costs replay time)
        compute_time = with_optimizer_steps(
            compute_time, lambda s: device_of(topology, devices[schedule.stage_ranks[s]]),
            costs.memory_efficiency, uniform=costs.uniform is not None,
            gpu_seconds_per_param=(costs.profile.optimizer_seconds_per_param
                                   if costs.profile else None))
    sizes = {axis: group_size(parallel, axis, shard) for axis in ("dp_shard", "dp_replicate")
             } if shard else {}
    collective = (profile_collective_model(env, costs.profile, parallel, sizes) if costs.profile
                  else collective_model(env, network, parallel, topology, shard))
    memory = memory_model(lowered, per_stage, model=model, parallel=parallel,
                          gpus_per_node=gpus_per_node(topology),
                          gathered=(gathered_bytes(model, parallel)
                                    if schedule.count(OpKind.ALL_GATHER) else None))
    replay = Replay(env, lowered, devices, compute_time, network, memory, collective, hosts,
                    overlapped=intra.overlapped_groups())
    try:
        timeline = replay.run()
    except DeadlockError:
        dry_run(schedule, intra.overlapped_groups())  # re-raises with the rank x step grid
        raise

    warnings = [host_warning] if host_warning else []
    capacity = device_of(topology, devices[0]).memory_bytes
    over = [r for r, peak in timeline.peak_memory().items() if peak > capacity]
    if over:
        warnings.append(f"ranks {over} exceed the device memory of {capacity / 1e9:.0f} GB")
    spanning = tp_groups_spanning_hosts(parallel, topology)
    if spanning:
        warnings.append(f"{len(spanning)} TP group(s) span several nodes, e.g. ranks "
                        f"{spanning[0]}: TP collectives cross the inter-node network "
                        "(simulated as flows)")
    for warning in warnings:
        log.info(warning)
    timeline.meta.update({
        "schedule": schedule.name, "pp": parallel.pp, "vpp": schedule.stages_per_rank,
        "dp": parallel.dp, "tp": parallel.tp, "cp": parallel.cp, "ep": parallel.ep,
        "etp": parallel.etp,
        "sequence_parallel": parallel.sequence_parallel,
        "tp_comm_overlap": intra.tp_comm_overlap, "cp_comm": intra.cp_comm,
        "moe_imbalance": intra.moe_imbalance, "scatter_gather": intra.scatter_gather,
        "microbatches": schedule.num_microbatches,
        "model": model.name or "custom", "topology": topology.graph.get("name", "custom"),
        "devices": devices, "device_memory_bytes": capacity, "oom_ranks": over,
        "warnings": warnings,
        "cost_model": "uniform" if costs.uniform else
        f"profile({costs.profile.device})" if costs.profile else
        f"roofline(compute_efficiency={costs.compute_efficiency}, "
        f"memory_efficiency={costs.memory_efficiency})",
    })
    return timeline
