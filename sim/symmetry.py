"""The symmetry the replay assumes, checked on the topology before it is relied on.

The simulator replays one program per pipeline coordinate (Plan.replayed_ranks) and
assumes every other rank of that coordinate runs alike. That holds only where the job's
GPUs are the same device and reach the network the same way. So, over the GPUs of the
job, refuse with the reason:
- a GPU of another device than the replayed ones (a slower GPU would make its whole DP or
  TP group wait: the symmetric replay cannot see it);
- a GPU, or a node one hop from a job GPU (its NIC, PCIe switch, host CPU, NVSwitch), whose
  links differ from those of the nodes of its role (a slow NIC or PCIe link): nodes of one
  type whose links are of the same kinds (an NVSwitch, a PCIe switch) share a role, and
  the set of (kind, bandwidth, latency) of their outgoing links must be the role's first
  node's. Counts are not compared (a partly filled node has fewer links), and switches
  further away are not checked;
- a placement that puts the ranks of one pipeline coordinate on hosts differently
  (`placement_asymmetry`; a layout's, not the topology's: sim.world then replays every
  rank): a pipeline line whose consecutive stages change host at other hops than the
  replayed line's (12 GPUs of pp 4 x dp 3 on two 8-GPU hosts: replica 0's line crosses
  between stages 2 and 3, replica 2's between 1 and 2), or a group (tp, cp, ep, dp and the
  gradient groups) whose GPUs split over hosts otherwise than the group of the replayed
  rank of its pipeline coordinate (GPUs per host, sorted). Hosts only: two groups on as
  many hosts but under different leaf switches pass.
"""
from __future__ import annotations

from collections import Counter

import networkx as nx

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.names import CP, DP, EP, PP, TP
from clustersim.schedules.plan import Plan

REASON = ("the simulator replays one pipeline replica and assumes every rank of a pipeline "
          "coordinate runs alike (docs/architecture.md, 'What is replayed'); a topology "
          "whose GPUs or links are not all alike would be ignored, so it is refused")


def _links(graph: nx.DiGraph, node: str) -> frozenset:
    return frozenset((a["kind"], a["bandwidth"], a["latency"])
                     for _, _, a in graph.out_edges(node, data=True))


def check_symmetric(plan: Plan, topology: nx.DiGraph) -> None:
    """Raise ConfigError naming the first node that breaks the replay's symmetry."""
    reason = asymmetry(plan, topology)
    if reason is not None:
        raise ConfigError(f"{reason}: {REASON}")


def asymmetry(plan: Plan, topology: nx.DiGraph) -> str | None:
    """The first node that breaks the replay's symmetry, in words (module docstring), or
    None."""
    return device_mismatch(plan, topology) or link_asymmetry(plan, topology)


def device_mismatch(plan: Plan, topology: nx.DiGraph) -> str | None:
    """A GPU of the job of another device than the first, in words, or None."""
    gpus = plan.cluster.gpus[:plan.world_size]
    device = topology.nodes[gpus[0]]["device"]
    odd = next((g for g in gpus if topology.nodes[g]["device"] != device), None)
    if odd is None:
        return None
    return f"{odd} is a {topology.nodes[odd]['device']}, {gpus[0]} a {device}"


def link_asymmetry(plan: Plan, topology: nx.DiGraph) -> str | None:
    """The first node of the job's GPUs or next to them whose links differ from those of
    the nodes of its role (module docstring), in words, or None."""
    gpus = plan.cluster.gpus[:plan.world_size]
    first: dict[tuple, tuple[str, frozenset]] = {}
    nodes = dict.fromkeys(gpus)
    for g in gpus:
        nodes.update(dict.fromkeys(topology.successors(g)))
    for node in nodes:
        links = _links(topology, node)
        role = (topology.nodes[node]["type"], frozenset(kind for kind, _, _ in links))
        name, reference = first.setdefault(role, (node, links))
        if links != reference:
            extra = sorted(links - reference) or sorted(reference - links)
            return (f"{node}'s links differ from {name}'s ({role[0]} nodes), e.g. (kind, "
                    f"bandwidth B/s, latency s) {extra[0]}")
    return None


def placement_asymmetry(plan: Plan) -> str | None:
    """The first pipeline line or group placed on hosts otherwise than the replayed
    rank's of its pipeline coordinate (module docstring), in words, or None."""
    hosts, replayed = plan.cluster.hosts, plan.replayed_ranks

    def crossings(line: list[int]) -> tuple[int, ...]:
        return tuple(i for i in range(len(line) - 1) if hosts[line[i]] != hosts[line[i + 1]])

    def split(group: list[int]) -> list[int]:  # GPUs per host, sorted
        return sorted(Counter(hosts[g] for g in group).values())

    reference = crossings(plan.group(PP, replayed[0]))
    for line in plan.groups(PP):
        if crossings(line) != reference:
            return (f"the pipeline of rank {line[0]} changes host after stages "
                    f"{list(crossings(line))}, the replayed one after {list(reference)}")
    axes = dict.fromkeys(a for a in (TP, CP, EP, DP, plan.grad_group, plan.expert_grad_group)
                         if a is not None and plan.group_size(a) > 1)
    for axis in axes:
        twins = {stage: split(plan.group(axis, rank)) for stage, rank in enumerate(replayed)}
        for group in plan.groups(axis):  # its ranks share one pipeline coordinate
            stage = plan.parallel.coords(group[0])[PP]
            if split(group) != twins[stage]:
                return (f"rank {group[0]}'s {axis} group has {split(group)} GPUs per host, "
                        f"the replayed rank {replayed[stage]}'s {twins[stage]}")
    return None
