"""The topology graph schema, the single-host NVLink builder and validation.

A topology is a `networkx.DiGraph`. Units: bandwidth in bytes/s, latency in seconds.

Schema (the one place it is defined):
- graph attrs: `name` (str), `num_nodes` (int >= 1, number of hosts), `gpus_per_node`
  (int >= 1, most GPUs on any host); optional `description` (str) and `fabric`
  ('fat-tree' | 'rail' | None: the inter-node network; absent or None = single host).
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
  host's local GPU i; `rail{i}.{g}` when the hosts are split into groups g.
- directed edges, one per direction of a link, each with `bandwidth` (> 0, bytes/s per
  direction), `latency` (>= 0, s) and `kind` (non-empty str: 'nvlink', 'pcie', 'ib',
  'roce', ...).
- every GPU can reach every other GPU along directed edges.

Builders are pure functions returning a new, validated graph; `BUILDERS` maps the names
preset files use to them: 'single_node' (here), 'node' (`topologies.nodes`), 'fat_tree'
and 'rail_optimized' (`topologies.clusters`). Routing lives in `topologies.routing`.
"""
from __future__ import annotations

import math
import re
from typing import Callable

import networkx as nx

from .devices import DEVICES, DeviceSpec, canonical_device_name, get_device
from .errors import TopologyError
from .routing import path_bandwidth, path_latency, route, routes  # noqa: F401 (re-exported)

NODE_TYPES = ("gpu", "switch", "nic", "host")
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
    gpus = [n for n, a in graph.nodes(data=True) if a.get("type") == "gpu"]
    return sorted(gpus, key=lambda n: graph.nodes[n]["index"])


def device_of(graph: nx.DiGraph, gpu: str) -> DeviceSpec:
    """The DeviceSpec of GPU node `gpu`."""
    if gpu not in graph or graph.nodes[gpu].get("type") != "gpu":
        raise TopologyError(f"{gpu!r} is not a gpu node of topology {graph.graph.get('name')!r}")
    return get_device(graph.nodes[gpu]["device"])


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_topology(graph: nx.DiGraph) -> None:
    """Check `graph` against the module schema; raise TopologyError naming the first violation."""
    where = f"topology {graph.graph.get('name')!r}"
    name = graph.graph.get("name")
    if not isinstance(name, str) or not name:
        raise TopologyError(f"{where}: graph attr name must be a non-empty string, got {name!r}")
    for attr in ("num_nodes", "gpus_per_node"):
        value = graph.graph.get(attr)
        if not _is_count(value) or value < 1:
            raise TopologyError(f"{where}: graph attr {attr} must be a positive integer, got {value!r}")
    fabric = graph.graph.get("fabric")
    if fabric is not None and fabric not in FABRICS:
        raise TopologyError(f"{where}: graph attr fabric must be one of {', '.join(FABRICS)} or None, got {fabric!r}")
    _validate_nodes(graph, where)
    _validate_edges(graph)
    _validate_reachability(graph, where)


def _validate_nodes(graph: nx.DiGraph, where: str) -> None:
    num_nodes, per_node = graph.graph["num_nodes"], graph.graph["gpus_per_node"]
    by_index: dict[int, str] = {}
    per_host: dict[int, int] = {}
    for node, attrs in graph.nodes(data=True):
        kind = attrs.get("type")
        if kind not in NODE_TYPES:
            raise TopologyError(f"node {node!r}: type must be one of {', '.join(NODE_TYPES)}, got {kind!r}")
        if kind != "gpu":
            continue
        device = attrs.get("device")
        if not isinstance(device, str) or device not in DEVICES:
            try:  # an alias gets a "did you mean"; an unknown name lists the known ones
                hint = f" (did you mean {canonical_device_name(device)!r}?)"
            except TopologyError as exc:
                hint = f"; {exc}"
            raise TopologyError(f"node {node!r}: device must be a canonical device name, got {device!r}{hint}")
        index, host = attrs.get("index"), attrs.get("host")
        if not _is_count(index) or index < 0:
            raise TopologyError(f"node {node!r}: index must be a non-negative integer, got {index!r}")
        if index in by_index:
            raise TopologyError(f"node {node!r}: duplicate gpu index {index} (also on {by_index[index]!r})")
        by_index[index] = node
        if node != f"gpu{index}":
            raise TopologyError(f"node {node!r}: gpu node id must be 'gpu{{index}}', i.e. 'gpu{index}'")
        if not _is_count(host) or not 0 <= host < num_nodes:
            raise TopologyError(
                f"node {node!r}: host must be an integer in 0..{num_nodes - 1} (num_nodes={num_nodes}), got {host!r}"
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
    for u, v, attrs in graph.edges(data=True):
        edge = f"edge {u}->{v}"
        bw, lat, kind = attrs.get("bandwidth"), attrs.get("latency"), attrs.get("kind")
        if not _is_number(bw) or bw <= 0:
            raise TopologyError(f"{edge}: bandwidth must be a positive number of bytes/s, got {bw!r}")
        if not _is_number(lat) or lat < 0:
            raise TopologyError(f"{edge}: latency must be a non-negative number of seconds, got {lat!r}")
        if not isinstance(kind, str) or not kind:
            raise TopologyError(f"{edge}: kind must be a non-empty string (e.g. 'nvlink'), got {kind!r}")


def _validate_reachability(graph: nx.DiGraph, where: str) -> None:
    # Mutual reachability of all GPUs <=> all GPUs in one strongly connected component.
    gpus = gpu_nodes(graph)
    component = next(c for c in nx.strongly_connected_components(graph) if gpus[0] in c)
    for gpu in gpus:
        if gpu not in component:
            src, dst = (gpu, gpus[0]) if gpu in nx.descendants(graph, gpus[0]) else (gpus[0], gpu)
            raise TopologyError(f"{where}: gpu {src!r} cannot reach gpu {dst!r} along directed edges")
