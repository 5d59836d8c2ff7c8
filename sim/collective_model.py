"""The replay's collective hook: a group axis of a pipeline rank -> member GPUs -> a run.

`collective_model(env, network, plan)` returns `run(op, pp_rank)`, which the
replay (sim.engine) calls for every collective op of pipeline rank r of the first
replica. The members are r's group along `op.group` (Plan.group), so every replica's
group is one of these: by symmetry only replica 0 is replayed (Plan.replayed_ranks;
docs/architecture.md).

Two ways to run it:
- flows (the default): the collective's algorithm runs as flows on the flow network
  (sim.collectives), sharing links with all other traffic. The job's other groups of the
  same axis at the same pipeline coordinate whose GPUs share the hosts of the rank's
  group (the other TP ranks' DP groups, the other shard members' replica groups, ...) run
  the same collective at the same moment, by symmetry: their flows start with it, their
  spans are dropped, so the whole job's load is felt on every link the groups share (two
  DP rings crossing one PCIe root complex each get half of it). Whether they share one is
  checked once per collective kind, axis and rank on an idle copy of the network (peers on
  links of their own, as on a DGX's rails, are then not simulated: they cannot change
  the rank's time, and skipping them keeps large runs fast: benchmarks/sim_speed.py).
- cached, for intra-layer groups (INTRA_LAYER_GROUPS: tp, cp, ep, etp) whose GPUs all
  sit on one host: the collective takes its uncontended time (sim.collective_algorithms.
  estimate_time of NCCL's choice, sim.nccl_collectives; the alpha-beta choice off CUDA), times
  `op.count`, computed once per (kind, bytes, count, member GPUs) and replayed as one
  timeout. APPROXIMATION: such a collective does not share the node's NVLink/NVSwitch
  links with other simulated traffic (pipeline P2P or data-parallel collectives inside
  the same node, or another replica's TP group on the same links), and does not slow
  them. Why: a Megatron layout puts each TP (and usually CP/EP) group inside an NVSwitch
  domain where every GPU has its own full-bandwidth port and the group's own traffic is
  all that crosses it while compute waits for it; and simulating ~10^5 per-layer
  collectives of a 1000-GPU iteration as flows would cost minutes (issue 6's budget is
  10 s). For a ring on an NVSwitch node the estimate equals the flow simulation
  (tests/test_collective_model.py). Groups that cross hosts always run as flows, so a TP
  group split over two nodes pays the inter-node network and its contention, with its
  peers' flows as above.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx
import simpy

from clustersim.schedules.names import DP_GROUPS, INTRA_LAYER_GROUPS, PP
from clustersim.schedules.ops import COLLECTIVE_KINDS, Op
from clustersim.schedules.plan import Plan
from clustersim.topologies import device_of

from .collective_algorithms import estimate_time, paid_latency
from .collectives import (collective_phases, latency_info, parse_collective, repeated,
                          run_collective)
from .cost import sm_sharing_slowdown
from .flows import FlowNetwork


DP_COMM_SMS = 24
"""SMs one data-parallel NCCL collective holds while it runs: the 24 thread blocks (one
per NCCL channel, each resident on one SM) of the ncclAllGather that FSDP's prefetch
launched beside a GEMM on an H100, in the Nsight Systems profile of NVIDIA Developer
Forums thread 337991, "Compute-Communication Overlap Causes Severe GEMM Performance
Degradation because of Tail Effect" (2025). NCCL_MIN_CTAS / NCCL_MAX_CTAS (ncclConfig_t
minCTAs / maxCTAs) set it on a real run."""


def overlap_slowdown(sm_count: int, comm_sms: int = DP_COMM_SMS) -> float:
    """The factor f by which a compute op slows while a data-parallel collective runs
    beside it on the same GPU: the GEMMs keep sm_count - comm_sms SMs, so they take
    sm_count / (sm_count - comm_sms) = 1 + f times as long, f = comm_sms / (sm_count -
    comm_sms). It is the law sim.cost applies to the GEMMs under Transformer Engine's TP
    overlap (schedules.intra_layer.TP_OVERLAP_COMM_SMS), here with NCCL's CTAs. On an H100
    (132 SMs) f = 24/108 = 0.22, against the average compute slowdown of 18.9% (at most
    40%) measured for overlapped compute and communication on A100, H100, MI210 and MI250
    GPUs in "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed
    Deep Learning: Performance and Power Implications", arXiv:2507.03114 (2025). The
    collective itself is not slowed (its flows keep their rates): NCCL's bandwidth loss to
    the GEMMs' HBM traffic is not modelled."""
    return sm_sharing_slowdown(sm_count, comm_sms)


def compute_slowdowns(plan: Plan, topology: nx.DiGraph) -> list[float]:
    """Per replayed pipeline rank: overlap_slowdown of its GPU (sim.engine applies it to
    a compute op while one of the rank's data-parallel collectives runs)."""
    return [overlap_slowdown(device_of(topology, gpu).sm_count) for gpu in plan.devices]


def slows_compute(op: Op) -> bool:
    """Whether `op` is a collective whose NCCL kernels slow the compute beside it
    (overlap_slowdown): the data-parallel ones (DP_GROUPS). TP collectives overlapped by
    Transformer Engine are charged statically by sim.cost (TP_OVERLAP_COMM_SMS); blocking
    intra-layer collectives overlap no compute; ring attention's KV passes and pipeline
    P2P are left at perfect overlap."""
    return op.group in DP_GROUPS and op.kind in COLLECTIVE_KINDS  # per posted op: no property


@dataclass(frozen=True)
class CollectiveHook:
    """What the replay calls per collective: `hook(op, rank)` returns the event of its end
    (value: its span info); `fixed(op, rank)` returns (seconds, info) when those do not
    depend on the network's state (an uncontended intra-node group), else None, so that
    sim.run_ahead may time it without events."""

    run: Callable[[Op, int], simpy.Event]
    fixed: Callable[[Op, int], tuple[float, dict] | None] | None = None

    def __call__(self, op: Op, rank: int) -> simpy.Event:
        return self.run(op, rank)


def collective_model(env: simpy.Environment, network: FlowNetwork, plan: Plan,
                     every_rank: bool = False) -> CollectiveHook:
    """The replay's collective hook (module docstring). With `every_rank` (the full
    replay, sim.world) the replay rank is the global rank and every group runs its own
    collectives: no shadow groups."""
    cluster, parallel = plan.cluster, plan.parallel
    gpus = cluster.gpus
    chosen: dict[tuple, str] = {}  # the default choice is a pure function of these
    cached: dict[tuple, tuple[float, dict]] = {}
    members_of: dict[tuple[str, int], tuple[list[int], list[str], bool]] = {}
    global_rank = range(plan.world_size) if every_rank else plan.replayed_ranks

    def members(axis: str, rank: int) -> tuple[list[int], list[str], bool]:
        """(global ranks, GPU nodes, whether the group may be cached) of rank's group."""
        hit = members_of.get((axis, rank))
        if hit is None:
            ranks = plan.group(axis, rank)
            devices = [gpus[g] for g in ranks]
            hit = members_of[(axis, rank)] = (ranks, devices, axis in INTRA_LAYER_GROUPS
                                              and not cluster.spans_hosts(ranks))
        return hit

    shadows: dict[tuple[str, int], list[tuple[list[int], list[str]]]] = {}

    def shadow_groups(axis: str, rank: int) -> list[tuple[list[int], list[str]]]:
        """The other replicas' `axis` groups on the hosts of rank's group (module doc)."""
        hit = shadows.get((axis, rank))
        if hit is None:
            hosts = {cluster.hosts[g] for g in members(axis, rank)[0]}
            pp = parallel.coords(rank)[PP]
            own, seen, hit = set(members(axis, rank)[0]), set(), []
            for other in range(parallel.world_size):
                if (other in own or other in seen or cluster.hosts[other] not in hosts
                        or parallel.coords(other)[PP] != pp):
                    continue
                ranks, devices, _ = members(axis, other)
                seen.update(ranks)
                hit.append((ranks, devices))
            shadows[(axis, rank)] = hit
        return hit

    slowed: dict[tuple, bool] = {}

    def peers_that_matter(op: Op, rank: int, algo: str) -> list[tuple[list[int], list[str]]]:
        """The rank's peer groups (shadow_groups), when running them with it slows its
        collective down on an idle copy of the network; none when they only use links of
        their own (a non-blocking fabric). Checked once per collective kind, axis, rank and
        algorithm: flows share a link's bandwidth whatever their size, so the answer does
        not depend on the message size."""
        peers = [] if every_rank else shadow_groups(op.group, rank)
        if not peers:
            return peers
        key = (op.kind, op.group, rank, algo)
        if key not in slowed:
            own = members(op.group, rank)[:2]
            alone = _isolated(op, algo, [own])
            slowed[key] = _isolated(op, algo, [own, *peers]) > alone * (1 + 1e-9)
        return peers if slowed[key] else []

    quiet = simpy.Environment()
    idle = FlowNetwork(quiet, network.graph)  # idle between checks; keeps its route cache

    def _isolated(op: Op, algo: str, groups: list[tuple[list[int], list[str]]]) -> float:
        """Seconds the first group's collective takes with the others', on an idle network."""
        runs = [run_collective(quiet, idle, op, devices, algorithm=algo, ranks=ranks)
                for ranks, devices in groups]
        quiet.run()
        span = runs[0].value.spans[0]
        return span.end - span.start

    def algorithm(op: Op, devices: list[str]) -> str:
        """The algorithm (and protocol) NCCL would pick for `op` on `devices`."""
        key = (op.kind, tuple(devices), op.nbytes, op.count)
        if key not in chosen:  # bucketed ops repeat sizes: pick each algorithm once
            chosen[key] = collective_phases(op, devices, op.nbytes / op.count,
                                            network.graph)[0]
        return chosen[key]

    def uncontended(op: Op, devices: list[str]) -> tuple[float, dict]:
        key = (op.kind, op.nbytes, op.count, tuple(devices))
        hit = cached.get(key)
        if hit is None:
            name, phases = collective_phases(op, devices, op.nbytes / op.count, network.graph)
            seconds = op.count * estimate_time(phases, network.graph)
            algbw = op.nbytes / seconds if seconds > 0 else 0.0
            coll = parse_collective(op)
            info = {"collective": coll.value, "algorithm": name, "count": op.count,
                    **latency_info(*paid_latency(repeated(phases, op.count))),
                    "bytes": op.nbytes,
                    "algbw_GBps": algbw / 1e9,
                    "busbw_GBps": algbw * coll.busbw_factor(len(devices)) / 1e9,
                    "model": "uncontended (intra-node)"}
            hit = cached[key] = (seconds, info)
        return hit

    def run(op: Op, pp_rank: int) -> simpy.Event:
        rank = global_rank[pp_rank]
        ranks, devices, cacheable = members(op.group, rank)
        if cacheable:
            seconds, info = uncontended(op, devices)
            return env.timeout(seconds, value=info)
        me = ranks.index(rank)
        algo = algorithm(op, devices)  # the peers' groups have the same shape: same choice
        for peer_ranks, peer_devices in peers_that_matter(op, rank, algo):
            run_collective(env, network, op, peer_devices, algorithm=algo, ranks=peer_ranks)
        result = env.event()
        running = run_collective(env, network, op, devices, algorithm=algo, ranks=ranks)
        running.callbacks.append(lambda ev: result.succeed(dict(ev.value.spans[me].info)))
        return result

    def fixed(op: Op, pp_rank: int) -> tuple[float, dict] | None:
        ranks, devices, cacheable = members(op.group, global_rank[pp_rank])
        return uncontended(op, devices) if cacheable else None

    return CollectiveHook(run, fixed)
