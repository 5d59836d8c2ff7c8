"""The topology graph schema, the single-host NVLink builder and validation.

A topology is a `networkx.DiGraph`. Units: bandwidth in bytes/s, latency in seconds.

Schema (the one place it is defined):
- graph attrs: `name` (str), `num_nodes` (int >= 1, number of hosts), `gpus_per_node`
  (int >= 1, most GPUs on any host); optional `description` (str), `fabric`
  ('fat-tree' | 'rail' | None: the inter-node network; absent or None = single host) and
  `in_network_reduction` (bool, default false: the switches reduce, InfiniBand SHARP).
- node attr `type` in {'gpu', 'switch', 'nic', 'host'}.
- gpu nodes also have `device` (canonical DeviceSpec name, e.g. 'h100-sxm'), `index`
  (global GPU index, 0..N-1, unique) and `host` (host index, 0..num_nodes-1). GPU node ids
  are the strings `gpu{index}`.
- node ids of the builders (other nodes carry `host` where they belong to one):
  `nvswitch{h}` (switch): the NVSwitch fabric of host h;
  `host{h}` (host): the CPU / root complex of host h;
  `pcie{h}.{k}` (switch): PCIe switch k of host h (PCIe-only boxes);
  `nic{i}` (nic): the network adapter of GPU i (one per GPU, on its PCIe link);
  `leaf{k}`, `spine{k}` (switch, attr `tier` 'leaf'/'spine'): fat-tree switches;
  `rail{i}` (switch, tier 'leaf', attr `rail`): the switch of rail i, i.e. of every
  host's local GPU i; `rail{i}.{g}` when the hosts are split into groups g;
  three-tier fabrics: `spine{p}.{j}` (tier 'spine', attrs `pod`, `plane`): spine j of
  pod p; `core{j}.{c}` (tier 'core', attr `plane`): core switch c of plane j.
- directed edges, one per direction of a link, each with `bandwidth` (> 0, bytes/s per
  direction), `latency` (>= 0, s) and `kind` (non-empty str: 'nvlink', 'pcie', 'ib',
  'roce', ...).
- every GPU can reach every other GPU along directed edges.

Builders are pure functions returning a new, validated graph; `BUILDERS` maps the names
preset files use to them: 'single_node' (here), 'node' (`topologies.nodes`), 'fat_tree',
'rail_optimized' and 'fat_tree_3tier' (`topologies.clusters`). Routing lives in
`topologies.routing`.

Size limit: MAX_GPUS (65,536) GPUs per topology, and `num_nodes` / `gpus_per_node` at most
as many; builders check it before adding a node, `validate_topology` on every graph. Why:
the largest clusters simulated are tens of thousands of GPUs, and at the limit a builder
already takes seconds and ~0.4 GB (fat_tree of 8,192 DGX H100: 150k nodes, 655k edges,
3.6 s on one core), while a mistyped 1e7 would take many minutes and ~60 GB.
"""
from __future__ import annotations

import math
import re
from typing import Callable

import networkx as nx

from clustersim.user_files import is_finite_number, short_repr

from .devices import DEVICES, DeviceSpec, canonical_device_name, get_device
from .errors import TopologyError
from .routing import path_bandwidth, path_latency, route, routes  # noqa: F401 (re-exported)

NODE_TYPES = ("gpu", "switch", "nic", "host")
MAX_GPUS = 65_536  # GPUs per topology (module docstring: why)
_GPU_ID = re.compile(r"gpu(\d+)")


def single_node(
    device: str,
    num_gpus: int = 8,
    bandwidth: float | None = None,
    latency: float = 1e-6,
    kind: str = "nvlink",
    name: str | None = None,
) -> nx.DiGraph:
    """One host of `num_gpus` GPUs, each linked to switch `nvswitch0` in both directions.

    `bandwidth` (bytes/s per direction) defaults to the device's NVLink bandwidth;
    `latency` (s) is per edge, so GPU-to-GPU costs two edges.
    """
    spec = get_device(device)
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise TopologyError(f"single_node: num_gpus must be a positive integer, got {num_gpus!r}")
    check_gpu_count("single_node: num_gpus", num_gpus)
    bw = spec.nvlink_bandwidth if bandwidth is None else bandwidth
    if not bw:
        raise TopologyError(
            f"single_node: device {spec.name!r} has no NVLink; give bandwidth= or use "
            f"the 'node' builder (e.g. node('pcie-a100'))")
    graph = nx.DiGraph(
        name=name or f"{spec.name}-x{num_gpus}", num_nodes=1, gpus_per_node=num_gpus
    )
    switch = "nvswitch0"
    graph.add_node(switch, type="switch", host=0)
    for i in range(num_gpus):
        gpu = f"gpu{i}"
        graph.add_node(gpu, type="gpu", device=spec.name, index=i, host=0)
        graph.add_edge(gpu, switch, bandwidth=bw, latency=latency, kind=kind)
        graph.add_edge(switch, gpu, bandwidth=bw, latency=latency, kind=kind)
    validate_topology(graph)
    return graph


# Filled in further by topologies.nodes and topologies.clusters (imported by the package).
BUILDERS: dict[str, Callable[..., nx.DiGraph]] = {"single_node": single_node}
FABRICS = ("fat-tree", "rail")


def gpu_nodes(graph: nx.DiGraph) -> list[str]:
    """GPU node ids ordered by their global `index`."""
    nodes = graph._node
    return sorted((n for n, a in nodes.items() if a.get("type") == "gpu"),
                  key=lambda n: nodes[n]["index"])


def device_of(graph: nx.DiGraph, gpu: str) -> DeviceSpec:
    """The DeviceSpec of GPU node `gpu`."""
    if gpu not in graph or graph.nodes[gpu].get("type") != "gpu":
        raise TopologyError(f"{gpu!r} is not a gpu node of topology {graph.graph.get('name')!r}")
    return get_device(graph.nodes[gpu]["device"])


def check_gpu_count(what: str, count: int) -> None:
    """Raise TopologyError unless `count` GPUs are within MAX_GPUS (`what` names the field)."""
    if count > MAX_GPUS:
        raise TopologyError(
            f"{what}: {short_repr(count)} GPUs, over the limit of {MAX_GPUS} GPUs per topology "
            f"(topologies.graph.MAX_GPUS: the graph's time and memory grow with its GPUs, "
            f"seconds and ~0.4 GB at the limit)")


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_topology(graph: nx.DiGraph) -> None:
    """Check `graph` against the module schema; raise TopologyError naming the first violation."""
    where = f"topology {short_repr(graph.graph.get('name'))}"
    name = graph.graph.get("name")
    if not isinstance(name, str) or not name:
        raise TopologyError(f"{where}: graph attr name must be a non-empty string, got {short_repr(name)}")
    for attr in ("num_nodes", "gpus_per_node"):
        value = graph.graph.get(attr)
        if not _is_count(value) or not 1 <= value <= MAX_GPUS:
            raise TopologyError(f"{where}: graph attr {attr} must be an integer 1..{MAX_GPUS} "
                                f"(MAX_GPUS), got {short_repr(value)}")
    fabric = graph.graph.get("fabric")
    if fabric is not None and fabric not in FABRICS:
        raise TopologyError(f"{where}: graph attr fabric must be one of {', '.join(FABRICS)} or None, got {short_repr(fabric)}")
    sharp = graph.graph.get("in_network_reduction", False)
    if not isinstance(sharp, bool):
        raise TopologyError(f"{where}: graph attr in_network_reduction must be true or false, "
                            f"got {short_repr(sharp)}")
    _validate_nodes(graph, where)
    _validate_edges(graph)
    _validate_reachability(graph, where)


def _validate_nodes(graph: nx.DiGraph, where: str) -> None:
    num_nodes, per_node = graph.graph["num_nodes"], graph.graph["gpus_per_node"]
    nodes = graph._node
    check_gpu_count(f"{where}: gpu nodes",
                    sum(1 for attrs in nodes.values() if attrs.get("type") == "gpu"))
    by_index: dict[int, str] = {}
    per_host: dict[int, int] = {}
    for node, attrs in nodes.items():
        kind = attrs.get("type")
        if kind not in NODE_TYPES:
            raise TopologyError(f"node {short_repr(node)}: type must be one of {', '.join(NODE_TYPES)}, got {short_repr(kind)}")
        if kind != "gpu":
            continue
        device = attrs.get("device")
        if not isinstance(device, str) or device not in DEVICES:
            try:  # an alias gets a "did you mean"; an unknown name lists the known ones
                hint = f" (did you mean {canonical_device_name(device)!r}?)"
            except TopologyError as exc:
                hint = f"; {exc}"
            raise TopologyError(f"node {short_repr(node)}: device must be a canonical device name, got {short_repr(device)}{hint}")
        index, host = attrs.get("index"), attrs.get("host")
        if not _is_count(index) or not 0 <= index < MAX_GPUS:
            raise TopologyError(f"node {short_repr(node)}: index must be an integer "
                                f"0..{MAX_GPUS - 1} (MAX_GPUS), got {short_repr(index)}")
        if index in by_index:
            raise TopologyError(f"node {short_repr(node)}: duplicate gpu index {index} (also on {by_index[index]!r})")
        by_index[index] = node
        if node != f"gpu{index}":
            raise TopologyError(f"node {short_repr(node)}: gpu node id must be 'gpu{{index}}', i.e. 'gpu{index}'")
        if not _is_count(host) or not 0 <= host < num_nodes:
            raise TopologyError(
                f"node {short_repr(node)}: host must be an integer in 0..{num_nodes - 1} (num_nodes={num_nodes}), got {short_repr(host)}"
            )
        per_host[host] = per_host.get(host, 0) + 1
        if per_host[host] > per_node:
            raise TopologyError(f"host {host}: has more than gpus_per_node={per_node} gpus")
    if not by_index:
        raise TopologyError(f"{where}: has no gpu nodes")
    missing = sorted(set(range(len(by_index))) - set(by_index))
    if missing:
        raise TopologyError(
            f"{where}: gpu indices must be 0..{len(by_index) - 1}; missing {missing[:5]}, "
            f"got max index {max(by_index)}"
        )


def _validate_edges(graph: nx.DiGraph) -> None:
    # The common case (float bandwidth and latency, str kind) is checked inline: the same
    # verdict as `_check_edge`, which gives the message of the first edge that fails.
    inf = math.inf
    for u, nbrs in graph._succ.items():
        for v, attrs in nbrs.items():
            bw, lat, kind = attrs.get("bandwidth"), attrs.get("latency"), attrs.get("kind")
            if not (type(bw) is float and 0 < bw < inf and type(lat) is float and 0 <= lat < inf
                    and type(kind) is str and kind):
                _check_edge(u, v, bw, lat, kind)


def _check_edge(u, v, bw, lat, kind) -> None:
    edge = f"edge {node_text(u)}->{node_text(v)}"
    if not is_finite_number(bw) or bw <= 0:
        raise TopologyError(f"{edge}: bandwidth must be a positive number of bytes/s, "
                            f"got {short_repr(bw)}")
    if not is_finite_number(lat) or lat < 0:
        raise TopologyError(f"{edge}: latency must be a non-negative number of seconds, "
                            f"got {short_repr(lat)}")
    if not isinstance(kind, str) or not kind:
        raise TopologyError(f"{edge}: kind must be a non-empty string (e.g. 'nvlink'), "
                            f"got {short_repr(kind)}")


def node_text(node: object) -> str:
    """A node id as messages write it: unquoted if a short string, else cut short."""
    return node if isinstance(node, str) and len(node) <= 60 else short_repr(node)


def _validate_reachability(graph: nx.DiGraph, where: str) -> None:
    # All GPUs in one strongly connected component <=> every GPU is reachable from the
    # first and reaches it: two breadth-first searches (plain dicts, no component list).
    gpus = gpu_nodes(graph)
    reached = _reachable(graph._succ, gpus[0])
    reaching = _reachable(graph._pred, gpus[0])
    for gpu in gpus:
        if gpu not in reached or gpu not in reaching:
            src, dst = (gpu, gpus[0]) if gpu in reached else (gpus[0], gpu)
            raise TopologyError(f"{where}: gpu {short_repr(src)} cannot reach gpu "
                                f"{short_repr(dst)} along directed edges")


def _reachable(adj: dict, start) -> set:
    seen, front = {start}, [start]
    while front:
        layer = []
        for u in front:
            for v in adj[u]:
                if v not in seen:
                    seen.add(v)
                    layer.append(v)
        front = layer
    return seen
