"""The replay's collective hook: a group axis of a pipeline rank -> member GPUs -> a run.

`collective_model(env, network, plan)` returns `run(op, pp_rank)`, which the
replay (sim.engine) calls for every collective op of pipeline rank r of the first
replica. The members are r's group along `op.group` (Plan.group), so every replica's
group is one of these: by symmetry only replica 0 is replayed (Plan.replayed_ranks;
docs/architecture.md).

Two ways to run it:
- flows (the default): the collective's algorithm runs as flows on the flow network
  (sim.collectives), sharing links with all other traffic. A 'dp_replicate' collective
  also starts the replica groups of the rank's other shard members (the traffic that
  shares the inter-node links); the span is the rank's own group's.
- cached, for intra-layer groups (INTRA_LAYER_GROUPS: tp, cp, ep, etp) whose GPUs all
  sit on one host: the collective takes its algorithm's uncontended alpha-beta time
  (sim.collective_algorithms.estimate_time, NCCL-style choice of the fastest), times
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
  group split over two nodes pays the inter-node network and its contention; the same
  collective of the other replicas' groups on those hosts (same pipeline coordinate,
  other tp/cp/dp coordinates) runs with it as flows whose spans are dropped, since that
  traffic shares the hosts' NICs and the fabric (as 'dp_replicate' does below).
"""
from __future__ import annotations

from collections.abc import Callable

import simpy

from clustersim.schedules.names import DP_REPLICATE, DP_SHARD, INTRA_LAYER_GROUPS, PP
from clustersim.schedules.ops import Op
from clustersim.schedules.plan import Plan

from .collective_algorithms import estimate_time
from .collectives import collective_phases, parse_collective, run_collective
from .flows import FlowNetwork


def collective_model(env: simpy.Environment, network: FlowNetwork, plan: Plan
                     ) -> Callable[[Op, int], simpy.Event]:
    """The replay's collective hook (module docstring)."""
    cluster, parallel = plan.cluster, plan.parallel
    gpus = cluster.gpus
    chosen: dict[tuple, str] = {}  # the default choice is a pure function of these
    cached: dict[tuple, tuple[float, dict]] = {}
    members_of: dict[tuple[str, int], tuple[list[int], list[str], bool]] = {}
    global_rank = plan.replayed_ranks

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

    def start(op: Op, ranks: list[int], devices: list[str]) -> simpy.Event:
        key = (op.kind, tuple(devices), op.nbytes, op.count)
        if key not in chosen:  # bucketed ops repeat sizes: pick each algorithm once
            chosen[key] = collective_phases(op, devices, op.nbytes / op.count,
                                            network.graph)[0]
        return run_collective(env, network, op, devices, algorithm=chosen[key], ranks=ranks)

    def uncontended(op: Op, devices: list[str]) -> tuple[float, dict]:
        key = (op.kind, op.nbytes, op.count, tuple(devices))
        hit = cached.get(key)
        if hit is None:
            name, phases = collective_phases(op, devices, op.nbytes / op.count, network.graph)
            seconds = op.count * estimate_time(phases, network.graph)
            algbw = op.nbytes / seconds if seconds > 0 else 0.0
            coll = parse_collective(op)
            info = {"collective": coll.value, "algorithm": name, "count": op.count,
                    "steps": op.count * sum(p.steps for p in phases), "bytes": op.nbytes,
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
        if op.group == DP_REPLICATE:
            for other in members(DP_SHARD, rank)[0]:
                if other != rank:
                    start(op, *members(DP_REPLICATE, other)[:2])
        elif op.group in INTRA_LAYER_GROUPS:
            for other in shadow_groups(op.group, rank):
                start(op, *other)
        result = env.event()
        running = start(op, ranks, devices)
        running.callbacks.append(lambda ev: result.succeed(dict(ev.value.spans[me].info)))
        return result

    return run
