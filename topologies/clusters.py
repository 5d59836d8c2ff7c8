"""Clusters of hosts (`topologies.nodes`) joined by an InfiniBand or RoCE network: a
two-level fat-tree (leaf/spine) or a rail-optimized fabric. Units: bytes/s per direction, s.

Network rates (`NETWORKS`, per port and direction, Gb/s / 8): InfiniBand 4x links per the
InfiniBand Trade Association roadmap, EDR 100 Gb/s = 12.5e9, HDR 200 Gb/s = 25e9, NDR
400 Gb/s = 50e9, XDR 800 Gb/s = 100e9 B/s (edge kind 'ib'); Ethernet per IEEE 802.3,
RoCE 100/200/400/800GbE = 12.5e9/25e9/50e9/100e9 B/s (kind 'roce'). Nominal signalling
rates; protocol overheads are left to calibration.

Wiring: every GPU i has NIC `nic{i}` (PCIe, see nodes), each NIC one port to its leaf.
Fat-tree: the NICs of `nodes_per_leaf` consecutive hosts share `leaf{k}`. Rail-optimized:
the NIC of local GPU i goes to rail switch `rail{i}` (one per rail, or `rail{i}.{g}` per
group g of `nodes_per_group` consecutive hosts). With more than one leaf, every leaf links
to every spine `spine{k}`; a leaf's uplinks total its downlink bandwidth / oversubscription
(r >= 1; r = 1 is non-blocking), split evenly over its spine links (a DiGraph holds one
link per leaf-spine pair, so several cables are one wider link). Default `num_spines`:
ceil(most downlinks of a leaf / r), i.e. one NIC-rate cable per spine.

Assumptions: `network_latency` 1 us per NIC-switch and switch-switch edge (switch hop plus
cable; an NDR switch alone is ~0.1-0.2 us), so a cross-spine GPU pair pays 4 network
edges + 2 PCIe edges. A three-level (core) tree is modelled as its two-level equivalent.

Size limits, checked before any node is added: num_nodes x GPUs per host <= MAX_GPUS
(`topologies.graph`, 65,536), and leaves x num_spines <= MAX_LEAF_SPINE_LINKS (131,072 =
2 x MAX_GPUS leaf-spine links; the default spine count of a MAX_GPUS cluster needs at
most that many, and every link is an edge of the graph and a path of the route search).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from clustersim.user_files import is_finite_number, short_repr

from .errors import TopologyError
from .graph import BUILDERS, MAX_GPUS, check_gpu_count, validate_topology
from .nodes import add_host, add_link, get_node_kind


MAX_LEAF_SPINE_LINKS = 2 * MAX_GPUS  # leaves x spines (module docstring)


@dataclass(frozen=True)
class NetworkSpec:
    """One port's rate of an inter-node network (bytes/s per direction) and its edge kind."""

    name: str
    bandwidth: float
    kind: str  # 'ib' | 'roce'


NETWORKS: dict[str, NetworkSpec] = {
    s.name: s for s in (
        NetworkSpec("edr", 12.5e9, "ib"), NetworkSpec("hdr", 25e9, "ib"),
        NetworkSpec("ndr", 50e9, "ib"), NetworkSpec("xdr", 100e9, "ib"),
        NetworkSpec("roce-100g", 12.5e9, "roce"), NetworkSpec("roce-200g", 25e9, "roce"),
        NetworkSpec("roce-400g", 50e9, "roce"), NetworkSpec("roce-800g", 100e9, "roce"),
    )
}


def get_network(name: str) -> NetworkSpec:
    """The NetworkSpec for `name` (case-insensitive: 'hdr', 'ndr', 'roce-400g', ...)."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in NETWORKS:
        raise TopologyError(f"unknown network {name!r}; known: {', '.join(NETWORKS)}")
    return NETWORKS[key]


def fat_tree(
    node_kind: str = "dgx-h100",
    num_nodes: int = 2,
    network: str = "ndr",
    nodes_per_leaf: int = 4,
    num_spines: int | None = None,
    oversubscription: float = 1.0,
    nvlink_latency: float = 1e-6,
    pcie_latency: float = 1e-6,
    network_latency: float = 1e-6,
    name: str | None = None,
) -> nx.DiGraph:
    """`num_nodes` hosts of `node_kind` on a two-level leaf/spine fat-tree (module docstring).

    A cluster that fits on one leaf has no spines.
    """
    _positive_int("fat_tree", "nodes_per_leaf", nodes_per_leaf)
    graph, net, hosts = _cluster("fat_tree", "fat-tree", node_kind, num_nodes, network,
                                 oversubscription, (nvlink_latency, pcie_latency), name,
                                 nodes_per_leaf, num_spines)
    leaves: dict[str, int] = {}
    for h, nics in enumerate(hosts):
        leaf = f"leaf{h // nodes_per_leaf}"
        if leaf not in leaves:
            graph.add_node(leaf, type="switch", tier="leaf")
            leaves[leaf] = 0
        for nic in nics:
            add_link(graph, nic, leaf, net.bandwidth, network_latency, net.kind)
        leaves[leaf] += len(nics)
    _add_spines(graph, "fat_tree", leaves, num_spines, oversubscription, net, network_latency)
    validate_topology(graph)
    return graph


def rail_optimized(
    node_kind: str = "dgx-h100",
    num_nodes: int = 2,
    network: str = "ndr",
    nodes_per_group: int | None = None,
    num_spines: int | None = None,
    oversubscription: float = 1.0,
    nvlink_latency: float = 1e-6,
    pcie_latency: float = 1e-6,
    network_latency: float = 1e-6,
    name: str | None = None,
) -> nx.DiGraph:
    """`num_nodes` hosts of `node_kind`, local GPU i of each on rail switch i, rails joined by
    spines (module docstring). `nodes_per_group` None = one group (switches `rail{i}`)."""
    if nodes_per_group is not None:
        _positive_int("rail_optimized", "nodes_per_group", nodes_per_group)
    graph, net, hosts = _cluster("rail_optimized", "rail", node_kind, num_nodes, network,
                                 oversubscription, (nvlink_latency, pcie_latency), name,
                                 nodes_per_group, num_spines)
    per_group = nodes_per_group or num_nodes
    grouped = num_nodes > per_group
    leaves: dict[str, int] = {}
    for h, nics in enumerate(hosts):
        group = h // per_group
        for rail, nic in enumerate(nics):
            switch = f"rail{rail}.{group}" if grouped else f"rail{rail}"
            if switch not in leaves:
                graph.add_node(switch, type="switch", tier="leaf", rail=rail, group=group)
                leaves[switch] = 0
            add_link(graph, nic, switch, net.bandwidth, network_latency, net.kind)
            leaves[switch] += 1
    _add_spines(graph, "rail_optimized", leaves, num_spines, oversubscription, net, network_latency)
    validate_topology(graph)
    return graph


def _positive_int(builder: str, field: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TopologyError(f"{builder}: {field} must be a positive integer, "
                            f"got {short_repr(value)}")


def _check_spines(builder: str, num_spines, leaves: int) -> None:
    """`num_spines` (None: the default) is a positive integer and, with `leaves` leaf
    switches (spines join >= 2), makes at most MAX_LEAF_SPINE_LINKS leaf-spine links."""
    if num_spines is None:
        return
    _positive_int(builder, "num_spines", num_spines)
    most = MAX_LEAF_SPINE_LINKS // max(leaves, 2)
    if num_spines > most:
        raise TopologyError(
            f"{builder}: num_spines must be at most {most} for {leaves} leaf switch(es), "
            f"got {num_spines}; rule: leaves x spines <= {MAX_LEAF_SPINE_LINKS} leaf-spine "
            f"links (MAX_LEAF_SPINE_LINKS = 2 x MAX_GPUS: more than a {MAX_GPUS}-GPU "
            f"cluster's default spine count needs)")


def _cluster(builder, fabric, node_kind, num_nodes, network, oversubscription, latencies, name,
             per_leaf, num_spines):
    """A graph with all hosts (GPUs, NICs) added; returns (graph, network, NICs per host).

    Checks the sizes first (module docstring): `per_leaf` hosts share a leaf (fat-tree)
    or a group of rail switches (rail; None: all hosts).
    """
    _positive_int(builder, "num_nodes", num_nodes)
    r = oversubscription
    if not is_finite_number(r) or r < 1:
        raise TopologyError(f"{builder}: oversubscription must be a number >= 1 "
                            f"(downlink : uplink bandwidth of a leaf), got {short_repr(r)}")
    kind, net = get_node_kind(node_kind), get_network(network)
    check_gpu_count(f"{builder}: num_nodes={short_repr(num_nodes)} x {kind.num_gpus} GPUs of "
                    f"{kind.name!r}", num_nodes * kind.num_gpus)
    leaves = -(-num_nodes // (per_leaf or num_nodes)) * (kind.num_gpus if fabric == "rail" else 1)
    _check_spines(builder, num_spines, leaves)
    suffix = {"fat-tree": "ft", "rail": "rail"}[fabric] + ("" if r == 1 else f"-{r:g}to1")
    graph = nx.DiGraph(name=name or f"{kind.name}-x{num_nodes}-{net.name}-{suffix}",
                       num_nodes=num_nodes, gpus_per_node=kind.num_gpus, fabric=fabric)
    nvlink_latency, pcie_latency = latencies
    hosts = []
    for h in range(num_nodes):
        gpus = add_host(graph, kind, h, h * kind.num_gpus, nics=True,
                        nvlink_latency=nvlink_latency, pcie_latency=pcie_latency)
        hosts.append([f"nic{g[3:]}" for g in gpus])
    return graph, net, hosts


def _add_spines(graph, builder, leaves: dict[str, int], num_spines, r, net: NetworkSpec,
                latency: float) -> None:
    """Link every leaf to every spine; each leaf's uplinks total its downlinks / r."""
    if len(leaves) < 2:
        return
    if num_spines is None:
        num_spines = math.ceil(max(leaves.values()) / r)
    _positive_int(builder, "num_spines", num_spines)
    spines = [f"spine{k}" for k in range(num_spines)]
    for spine in spines:
        graph.add_node(spine, type="switch", tier="spine")
    for leaf, downlinks in leaves.items():
        uplink = downlinks * net.bandwidth / r / num_spines
        for spine in spines:
            add_link(graph, leaf, spine, uplink, latency, net.kind)


BUILDERS.update(fat_tree=fat_tree, rail_optimized=rail_optimized)
