"""Clusters of hosts (`topologies.nodes`) joined by an InfiniBand or RoCE network: a
two-level fat-tree (leaf/spine), a rail-optimized fabric, or a three-tier Clos (leaf,
spine, core) of pods. Units: bytes/s per direction, s.

Network rates (`NETWORKS`, per port and direction, Gb/s / 8): InfiniBand 4x links per the
InfiniBand Trade Association roadmap, EDR 100 Gb/s = 12.5e9, HDR 200 Gb/s = 25e9, NDR
400 Gb/s = 50e9, XDR 800 Gb/s = 100e9 B/s (edge kind 'ib'); Ethernet per IEEE 802.3,
RoCE 100/200/400/800GbE = 12.5e9/25e9/50e9/100e9 B/s (kind 'roce'). Nominal signalling
rates; protocol overheads are left to calibration.

Wiring: every GPU i has NIC `nic{i}` (PCIe, see nodes), each NIC one port to its leaf. A
DiGraph holds one link per switch pair, so several parallel cables are one wider link.

`fat_tree`, `rail_optimized` (two tiers). Fat-tree: the NICs of `nodes_per_leaf`
consecutive hosts share `leaf{k}`. Rail-optimized: the NIC of local GPU i goes to rail
switch `rail{i}` (one per rail, or `rail{i}.{g}` per group g of `nodes_per_group`
consecutive hosts). With more than one leaf, every leaf links to every spine `spine{k}`;
a leaf's uplinks total its downlink bandwidth / oversubscription (r >= 1; r = 1 is
non-blocking), split evenly over its spine links. Default `num_spines`: ceil(most
downlinks of a leaf / r), i.e. one NIC-rate cable per spine.

`fat_tree_3tier` (three tiers, the Clos of today's large training clusters):
- leaves: as above, `leaf{k}` for `nodes_per_leaf` consecutive hosts, or with `rails`
  one switch `rail{i}.{g}` per rail i and group g of `nodes_per_leaf` hosts (the DGX
  SuperPOD's scalable unit is such a group: 32 nodes, 8 rail leaves);
- pods: `nodes_per_pod` consecutive hosts (a multiple of `nodes_per_leaf`, so no leaf
  spans two pods); every leaf of pod p links to each of the pod's `num_spines` spines
  `spine{p}.{j}`; a leaf's uplinks total its downlinks / `leaf_oversubscription`;
- core: spine j of every pod belongs to plane j and links to each of the plane's
  `cores_per_plane` cores `core{j}.{c}` (the standard fat-tree / Clos plane wiring); a
  spine's core uplinks total its leaf links / `pod_oversubscription`. So a pod of N
  NICs sends N x rate / (leaf_oversubscription x pod_oversubscription) to the core, and
  the bisection between two halves of P pods is P/2 times that (tests/test_fabrics.py
  checks it by max-flow). One pod builds no core tier; one leaf no spines.
- a cross-pod route is nic -> leaf -> spine -> core -> spine (same plane) -> leaf -> nic,
  with num_spines x cores_per_plane equal-cost paths; within a pod leaf -> spine -> leaf.
- links are sized for full leaves and full pods (design ports), also where the last
  leaf or pod holds fewer hosts: the DGX SuperPOD RA builds the fabric for whole SUs.
- defaults: `num_spines` = a full leaf's downlinks / leaf_oversubscription, rounded down
  (at least 1), and `cores_per_plane` = a spine's uplink bandwidth / the NIC rate,
  rounded down (at least 1): as many switches as keep every link at least one port wide
  (a spine whose whole uplink is under one port gets one narrower link). Sources give
  the switch counts where they have them (presets set them).
- node attributes: `tier` ('leaf' | 'spine' | 'core'), `pod` (leaves, spines), `plane`
  (spines, cores), and for rail leaves `rail` and `group`. Graph attr `fabric`: 'rail'
  with rails, else 'fat-tree'.
Sources of the presets built with it: the Llama 3 paper (Llama Team, AI @ Meta, "The
Llama 3 Herd of Models", arXiv 2407.21783, section 3.3.1 "Network": racks of 16 GPUs
on one ToR, pods of 192 racks = 3,072 GPUs at full bisection, 8 pods joined at the
aggregation layer with 1:7 oversubscription, 400 Gb/s RoCE), and NVIDIA's DGX SuperPOD
reference architecture with DGX H100 (RA-11333-001 V11: SUs of 32 nodes, rail-optimized
NDR, Table 4 for 1-4 SUs, Table 3 for 4-64 SUs with the core tier from 16 SUs).

Assumptions: `network_latency` 1 us per NIC-switch and switch-switch edge (switch hop plus
cable; an NDR switch alone is ~0.1-0.2 us), so a cross-spine GPU pair pays 4 network
edges + 2 PCIe edges, a cross-pod pair of a three-tier fabric 6 + 2. Routing is the
fewest-hop widest rule of `topologies.routing` (ECMP over spines and cores; no adaptive
or PXN-style relay through another GPU's NIC). Oversubscription is of bandwidth, not of
switch ports; buffering, congestion control and hashing collisions are not modelled.

Size limits, checked before any node is added, each refusal one TopologyError naming the
parameter and the rule: num_nodes x GPUs per host <= MAX_GPUS (`topologies.graph`,
65,536); leaves x spines (per pod) <= MAX_LEAF_SPINE_LINKS (131,072 = 2 x MAX_GPUS
leaf-spine links; the default spine count of a MAX_GPUS cluster needs at most that many,
and every link is an edge of the graph and a path of the route search); for the three-tier
fabric also pods x spines per pod x cores per plane <= MAX_LEAF_SPINE_LINKS spine-core
links, which also keeps a pair's equal-cost paths (spines x cores per plane) under
`routing.MAX_EQUAL_COST_PATHS`. Measured (one core of a shared 2-core VM, Python 3.11,
networkx 3.6): the 24,576-GPU `llama3-24k-roce` preset loads in ~1.3 s with ~150 MB peak
RSS (57k nodes, 253k edges); a cross-pod route (432 paths) takes ~6 ms, within a pod
(16 paths) ~0.2 ms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from clustersim.user_files import is_finite_number, short_repr

from .errors import TopologyError
from .graph import BUILDERS, MAX_GPUS, check_gpu_count, validate_topology
from .nodes import add_host, add_parts, get_node_kind, link_attrs


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
    in_network_reduction: bool = False,
) -> nx.DiGraph:
    """`num_nodes` hosts of `node_kind` on a two-level leaf/spine fat-tree (module docstring).

    A cluster that fits on one leaf has no spines. `in_network_reduction`: the switches
    reduce in the network (InfiniBand SHARP), which NCCL's CollNet uses (graph attr).
    """
    _positive_int("fat_tree", "nodes_per_leaf", nodes_per_leaf)
    if not isinstance(in_network_reduction, bool):
        raise TopologyError(f"fat_tree: in_network_reduction must be true or false, got "
                            f"{short_repr(in_network_reduction)}")
    graph, net, hosts = _cluster("fat_tree", "fat-tree", node_kind, num_nodes, network,
                                 oversubscription, (nvlink_latency, pcie_latency), name,
                                 nodes_per_leaf, num_spines)
    if in_network_reduction:
        graph.graph["in_network_reduction"] = True
    leaves: dict[str, int] = {}
    nodes, links, port = [], [], link_attrs(net.bandwidth, network_latency, net.kind)
    for h, nics in enumerate(hosts):
        leaf = f"leaf{h // nodes_per_leaf}"
        if leaf not in leaves:
            nodes.append((leaf, {"type": "switch", "tier": "leaf"}))
            leaves[leaf] = 0
        links += [(nic, leaf, port) for nic in nics]
        leaves[leaf] += len(nics)
    add_parts(graph, nodes, links)
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
    nodes, links, port = [], [], link_attrs(net.bandwidth, network_latency, net.kind)
    for h, nics in enumerate(hosts):
        group = h // per_group
        for rail, nic in enumerate(nics):
            switch = f"rail{rail}.{group}" if grouped else f"rail{rail}"
            if switch not in leaves:
                nodes.append((switch, {"type": "switch", "tier": "leaf", "rail": rail,
                                       "group": group}))
                leaves[switch] = 0
            links.append((nic, switch, port))
            leaves[switch] += 1
    add_parts(graph, nodes, links)
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
    _check_oversubscription(builder, "oversubscription", r, "downlink : uplink bandwidth of a leaf")
    kind, net = _hosts_and_network(builder, node_kind, num_nodes, network)
    leaves = -(-num_nodes // (per_leaf or num_nodes)) * (kind.num_gpus if fabric == "rail" else 1)
    _check_spines(builder, num_spines, leaves)
    suffix = {"fat-tree": "ft", "rail": "rail"}[fabric] + ("" if r == 1 else f"-{r:g}to1")
    graph = nx.DiGraph(name=name or f"{kind.name}-x{num_nodes}-{net.name}-{suffix}",
                       num_nodes=num_nodes, gpus_per_node=kind.num_gpus, fabric=fabric)
    return graph, net, _add_hosts(graph, kind, num_nodes, latencies)


def _check_oversubscription(builder: str, field: str, r, ratio: str) -> None:
    """An oversubscription (`ratio`, e.g. a leaf's downlink : uplink bandwidth) is a finite
    number >= 1."""
    if not is_finite_number(r) or r < 1:
        raise TopologyError(f"{builder}: {field} must be a number >= 1 ({ratio}; 1 = "
                            f"non-blocking), got {short_repr(r)}")


def _hosts_and_network(builder: str, node_kind, num_nodes: int, network):
    """(NodeKind, NetworkSpec) of a cluster, its GPU count checked against MAX_GPUS."""
    kind, net = get_node_kind(node_kind), get_network(network)
    check_gpu_count(f"{builder}: num_nodes={short_repr(num_nodes)} x {kind.num_gpus} GPUs of "
                    f"{kind.name!r}", num_nodes * kind.num_gpus)
    return kind, net


def _add_hosts(graph, kind, num_nodes: int, latencies) -> list[list[str]]:
    """Add `num_nodes` hosts of `kind` with one NIC per GPU; return each host's NIC ids."""
    nvlink_latency, pcie_latency = latencies
    hosts = []
    for h in range(num_nodes):
        gpus = add_host(graph, kind, h, h * kind.num_gpus, nics=True,
                        nvlink_latency=nvlink_latency, pcie_latency=pcie_latency)
        hosts.append([f"nic{g[3:]}" for g in gpus])
    return hosts


def _add_spines(graph, builder, leaves: dict[str, int], num_spines, r, net: NetworkSpec,
                latency: float) -> None:
    """Link every leaf to every spine; each leaf's uplinks total its downlinks / r."""
    if len(leaves) < 2:
        return
    if num_spines is None:
        num_spines = math.ceil(max(leaves.values()) / r)
    _positive_int(builder, "num_spines", num_spines)
    spines = [f"spine{k}" for k in range(num_spines)]
    links = []
    for leaf, downlinks in leaves.items():
        uplink = link_attrs(downlinks * net.bandwidth / r / num_spines, latency, net.kind)
        links += [(leaf, spine, uplink) for spine in spines]
    add_parts(graph, [(spine, {"type": "switch", "tier": "spine"}) for spine in spines], links)


def fat_tree_3tier(
    node_kind: str = "dgx-h100",
    num_nodes: int = 16,
    network: str = "ndr",
    nodes_per_pod: int = 8,
    nodes_per_leaf: int = 4,
    rails: bool = False,
    num_spines: int | None = None,
    cores_per_plane: int | None = None,
    leaf_oversubscription: float = 1.0,
    pod_oversubscription: float = 1.0,
    nvlink_latency: float = 1e-6,
    pcie_latency: float = 1e-6,
    network_latency: float = 1e-6,
    name: str | None = None,
) -> nx.DiGraph:
    """`num_nodes` hosts of `node_kind` on a three-tier Clos: leaves, then pods of
    `nodes_per_pod` hosts whose leaves share `num_spines` spines, then core planes joining
    the pods (module docstring: wiring, defaults, limits).

    `nodes_per_leaf`: hosts per leaf, or with `rails` hosts per rail group (local GPU i of
    each goes to `rail{i}.{g}`); `num_spines` per pod; `cores_per_plane` core switches
    per plane (one plane per spine index). `leaf_oversubscription`: a leaf's downlink :
    uplink bandwidth; `pod_oversubscription`: a spine's, i.e. a pod's bandwidth from its
    leaves : to the core. One pod has no core tier; one leaf has no spines.
    """
    plan = _ClosPlan.check(node_kind, num_nodes, network, nodes_per_pod, nodes_per_leaf, rails,
                           num_spines, cores_per_plane, leaf_oversubscription,
                           pod_oversubscription)
    kind, net = plan.kind, plan.net
    suffix = "".join(f"-{tier}{r:g}to1" for tier, r in
                     (("l", leaf_oversubscription), ("p", pod_oversubscription)) if r != 1)
    graph = nx.DiGraph(
        name=name or (f"{kind.name}-x{num_nodes}-{net.name}-{'rail' if rails else 'ft'}3-"
                      f"{plan.pods}pod{suffix}"),
        num_nodes=num_nodes, gpus_per_node=kind.num_gpus, fabric="rail" if rails else "fat-tree")
    hosts = _add_hosts(graph, kind, num_nodes, (nvlink_latency, pcie_latency))
    leaves: dict[str, int] = {}  # leaf -> pod
    nodes, links, port = [], [], link_attrs(net.bandwidth, network_latency, net.kind)
    for h, nics in enumerate(hosts):
        pod, group = h // nodes_per_pod, h // nodes_per_leaf
        for rail, nic in enumerate(nics):
            leaf = f"rail{rail}.{group}" if rails else f"leaf{group}"
            if leaf not in leaves:
                extra = {"rail": rail, "group": group} if rails else {}
                nodes.append((leaf, {"type": "switch", "tier": "leaf", "pod": pod, **extra}))
                leaves[leaf] = pod
            links.append((nic, leaf, port))
    spines = [[f"spine{pod}.{j}" for j in range(plan.spines)] for pod in range(plan.pods)]
    if len(leaves) > 1:
        nodes += [(spine, {"type": "switch", "tier": "spine", "pod": pod, "plane": j})
                  for pod, row in enumerate(spines) for j, spine in enumerate(row)]
        up = link_attrs(plan.leaf_spine_bandwidth, network_latency, net.kind)
        links += [(leaf, spine, up) for leaf, pod in leaves.items() for spine in spines[pod]]
    if plan.pods > 1:
        cores = [[f"core{j}.{c}" for c in range(plan.cores_per_plane)] for j in range(plan.spines)]
        nodes += [(core, {"type": "switch", "tier": "core", "plane": j})
                  for j, row in enumerate(cores) for core in row]
        up = link_attrs(plan.spine_core_bandwidth, network_latency, net.kind)
        links += [(spine, core, up) for row in spines for j, spine in enumerate(row)
                  for core in cores[j]]
    add_parts(graph, nodes, links)
    validate_topology(graph)
    return graph


@dataclass(frozen=True)
class _ClosPlan:
    """The checked sizes and link rates of a `fat_tree_3tier` (module docstring)."""

    kind: object
    net: NetworkSpec
    pods: int
    leaves: int  # leaf switches built
    spines: int  # per pod
    cores_per_plane: int
    leaf_spine_bandwidth: float  # bytes/s per direction of one leaf-spine link
    spine_core_bandwidth: float  # of one spine-core link

    @classmethod
    def check(cls, node_kind, num_nodes, network, nodes_per_pod, nodes_per_leaf, rails,
              num_spines, cores_per_plane, leaf_r, pod_r) -> "_ClosPlan":
        """Every parameter and size limit, before any node is built; one TopologyError
        naming the parameter and its rule otherwise."""
        b = "fat_tree_3tier"
        for field, value in (("num_nodes", num_nodes), ("nodes_per_pod", nodes_per_pod),
                             ("nodes_per_leaf", nodes_per_leaf)):
            _positive_int(b, field, value)
        for field, value in (("nodes_per_pod", nodes_per_pod), ("nodes_per_leaf", nodes_per_leaf)):
            if value > MAX_GPUS:
                raise TopologyError(f"{b}: {field} must be at most {MAX_GPUS} hosts (MAX_GPUS: "
                                    f"no topology holds more), got {short_repr(value)}")
        if not isinstance(rails, bool):
            raise TopologyError(f"{b}: rails must be true or false, got {short_repr(rails)}")
        _check_oversubscription(b, "leaf_oversubscription", leaf_r,
                                "downlink : uplink bandwidth of a leaf")
        _check_oversubscription(b, "pod_oversubscription", pod_r,
                                "a spine's leaf : core bandwidth")
        kind, net = _hosts_and_network(b, node_kind, num_nodes, network)
        if nodes_per_pod % nodes_per_leaf:
            raise TopologyError(f"{b}: nodes_per_pod must be a multiple of nodes_per_leaf "
                                f"({nodes_per_leaf}) so that no leaf spans two pods, got "
                                f"{nodes_per_pod}")
        per_leaf = 1 if rails else kind.num_gpus  # NIC downlinks a leaf has per host
        leaves = -(-num_nodes // nodes_per_leaf) * (kind.num_gpus if rails else 1)
        pods = -(-num_nodes // nodes_per_pod)
        downlinks = nodes_per_leaf * per_leaf  # of a full leaf
        spines = num_spines
        if spines is None:  # one leaf builds no spines
            spines = max(1, math.floor(round(downlinks / leaf_r, 9))) if leaves > 1 else 1
        else:
            _positive_int(b, "num_spines", spines)
        most = MAX_LEAF_SPINE_LINKS // max(leaves, 2)
        if spines > most:
            given = "num_spines" if num_spines is not None else (
                "num_spines (default: nodes_per_leaf x NICs per leaf per host / "
                "leaf_oversubscription, rounded down)")
            raise TopologyError(
                f"{b}: {given} must be at most {most} for {leaves} leaf switch(es), got "
                f"{spines}; rule: leaves x spines per pod <= {MAX_LEAF_SPINE_LINKS} leaf-spine "
                f"links (MAX_LEAF_SPINE_LINKS = 2 x MAX_GPUS)")
        leaf_spine = downlinks * net.bandwidth / leaf_r / spines
        leaves_per_pod = nodes_per_pod // nodes_per_leaf * (kind.num_gpus if rails else 1)
        spine_up = leaves_per_pod * leaf_spine / pod_r  # bytes/s from one spine to the core
        cores = cores_per_plane
        if cores is None:
            cores = max(1, math.floor(round(spine_up / net.bandwidth, 9))) if pods > 1 else 1
        else:
            _positive_int(b, "cores_per_plane", cores)
        most = MAX_LEAF_SPINE_LINKS // max(pods * spines, 2)
        if cores > most:
            given = "cores_per_plane" if cores_per_plane is not None else (
                "cores_per_plane (default: a spine's uplink bandwidth / the NIC rate, "
                "rounded down)")
            raise TopologyError(
                f"{b}: {given} must be at most {most} for {pods} pod(s) of {spines} spines, "
                f"got {cores}; rule: pods x spines per pod x cores per plane <= "
                f"{MAX_LEAF_SPINE_LINKS} spine-core links (MAX_LEAF_SPINE_LINKS)")
        return cls(kind, net, pods, leaves, spines, cores, leaf_spine, spine_up / cores)


BUILDERS.update(fat_tree=fat_tree, rail_optimized=rail_optimized, fat_tree_3tier=fat_tree_3tier)
