"""The bandwidth a link gives GPU transfers: its line rate times what NCCL's kernels reach.

The topology holds line rates (topologies.graph, edge attr `bandwidth`, bytes/s per
direction). Every flow of the simulator (collectives, pipeline sends) moves at most the
achievable rate of each link instead, `achievable_capacities(graph)`, per edge kind:
- 'nvlink': NCCL's bandwidth per NVLink link for the GPU's compute capability over the
  link's line rate per direction. NCCL 2.30.7 src/graph/topo.h: SM80_NVLINK_BW 20.0,
  SM90_NVLINK_BW 20.6, SM100_NVLINK_BW 40.1 GB/s; NVLink3 and NVLink4 signal 25 GB/s per
  direction per link, NVLink5 50 GB/s (A100 12 links = 300 GB/s, H100 18 = 450 GB/s,
  B200 18 = 900 GB/s per direction). Fractions 0.8, 0.824, 0.802. The edge's GPU is its
  endpoint (a GPU-NVSwitch link) or, for a link between two switches, the first GPU of
  the graph.
- 'pcie': NCCL's rate of a PCIe link, lanes x its per-lane figure (src/graph/topo.cc,
  kvDictPciGen: 16 GT/s -> 12 Gb/s, 32 GT/s -> 24 Gb/s per lane), 0.75 of the raw
  signalling rate the topology holds (Gen4 x16: 32 -> 24 GB/s; Gen5 x16: 64 -> 48 GB/s).
- 'ib' and 'roce' (NIC ports and switch links): NIC_EFFICIENCY, 48/50: what NCCL's
  maintainers say nccl-tests reaches per NIC (NCCL_NIC_SOURCE). NCCL's own topology takes
  the port at line rate (topo.cc: mbps / 8000).
- any other kind (e.g. 'xgmi', 'c2c'): line rate (no NCCL figure; RCCL is not modelled).
Units: bytes/s per direction.
"""
from __future__ import annotations

import weakref
from functools import lru_cache

import networkx as nx
import numpy as np

from clustersim.topologies import get_device

NVLINK_GBPS_PER_LINK = {80: 20.0, 90: 20.6, 100: 40.1}
"""NCCL's SMxx_NVLINK_BW (GB/s per link per direction) by compute capability x 10
(NCCL 2.30.7, src/graph/topo.h; SM86's 12.0 is a GeForce part, not modelled)."""
NVLINK_LINE_GBPS_PER_LINK = {80: 25.0, 90: 25.0, 100: 50.0}
"""Line rate per NVLink link per direction, GB/s: NVLink3 (A100), NVLink4 (H100/H200), NVLink5
(B200/GB200) (NVIDIA's datasheets: 600, 900 and 1,800 GB/s bidirectional per GPU over
12, 18 and 18 links)."""
PCIE_EFFICIENCY = 0.75  # NCCL's 12 Gb/s per lane at 16 GT/s (kvDictPciGen, topo.cc)
NIC_EFFICIENCY = 48 / 50
NCCL_NIC_SOURCE = (
    "NVIDIA/nccl-tests issue 319 (AddyLaddy, 2025-06-11): 'around 48GB/s from each CX7 NIC "
    "at 400Gbps'; issue 290 (2025-03-03): 'For NDR @ 400Gbps you should see 46-48GB/s per "
    "NIC'; issue 119 (sjeaugey, 2022-11-17): '24GB/s is the peak performance per 200G NIC "
    "(12 GB/s for 100G NICs)'")

_BY_GRAPH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> capacities


def nvlink_efficiency(compute_capability: tuple[int, int] | None) -> float:
    """NCCL's NVLink bandwidth over the line rate for a GPU of this compute capability
    (1.0 where NCCL has no figure: not a CUDA GPU or older than SM80)."""
    if compute_capability is None:
        return 1.0
    cc = compute_capability[0] * 10 + compute_capability[1]
    keys = [k for k in NVLINK_GBPS_PER_LINK if k <= cc]
    if not keys:
        return 1.0
    key = max(keys)
    return NVLINK_GBPS_PER_LINK[key] / NVLINK_LINE_GBPS_PER_LINK[key]


@lru_cache(maxsize=None)
def _device_nvlink_efficiency(device: str) -> float:
    return nvlink_efficiency(get_device(device).compute_capability)


def link_efficiency(graph: nx.DiGraph, u: str, v: str) -> float:
    """Achievable / line rate of edge (u, v) (module docstring)."""
    return _efficiency(graph, u, v, graph.adj[u][v]["kind"])


_KIND_EFFICIENCY = {"pcie": PCIE_EFFICIENCY, "ib": NIC_EFFICIENCY, "roce": NIC_EFFICIENCY}
"""`_efficiency` of the link kinds whose figure does not depend on the link's ends."""


def _efficiency(graph: nx.DiGraph, u: str, v: str, kind: str) -> float:
    """`link_efficiency` of edge (u, v), whose kind is `kind`."""
    if kind == "nvlink":
        nodes = graph._node  # a plain dict: this runs once per edge of a 250k-edge fabric
        gpu = u if nodes[u].get("type") == "gpu" else v if nodes[v].get("type") == "gpu" \
            else _first_gpu(graph)  # a link between two switches: the first GPU's NVLink
        if gpu is None:
            return 1.0
        return _device_nvlink_efficiency(nodes[gpu]["device"])
    return _KIND_EFFICIENCY.get(kind, 1.0)


def _first_gpu(graph: nx.DiGraph) -> str | None:
    return next((n for n, t in graph.nodes(data="type") if t == "gpu"), None)


def achievable_capacities(graph: nx.DiGraph) -> np.ndarray:
    """Achievable bytes/s per direction of every edge, in `graph.edges` order; computed
    once per graph object (a graph changed afterwards keeps its old figures)."""
    hit = _BY_GRAPH.get(graph)
    if hit is None:
        hit = np.fromiter((attrs["bandwidth"] * _efficiency(graph, u, v, attrs["kind"])
                           for u, nbrs in graph._succ.items()  # in graph.edges' order
                           for v, attrs in nbrs.items()),
                          dtype=float, count=graph.number_of_edges())
        _BY_GRAPH[graph] = hit
    return hit


def out_capacity(graph: nx.DiGraph, node: str, kinds: tuple[str, ...]) -> float:
    """Achievable bytes/s of `node`'s outgoing edges of these kinds together."""
    return float(sum(attrs["bandwidth"] * _efficiency(graph, node, v, attrs["kind"])
                     for v, attrs in graph._succ[node].items() if attrs["kind"] in kinds))
