"""One host (a cluster node) of the topology graph: its GPUs, their NVSwitch or PCIe
switches, the host CPU and, in clusters, one NIC per GPU. Units: bytes/s per direction, s.

Node kinds (`NODE_KINDS`) and their sources:
- 'dgx-a100' / 'hgx-a100': 8x A100 80GB SXM on NVSwitch (NVLink3, 600 GB/s bidirectional
  = 300e9 B/s per direction per GPU), PCIe Gen4, 8x ConnectX-6 HDR (NVIDIA DGX A100
  datasheet / System Architecture whitepaper).
- 'dgx-h100' / 'hgx-h100', 'dgx-h200' / 'hgx-h200': 8x H100 / H200 SXM on NVSwitch
  (NVLink4, 900 GB/s bidirectional = 450e9 per direction), PCIe Gen5, 8x ConnectX-7 NDR
  (NVIDIA DGX H100 / DGX H200 datasheets). DGX and HGX are the same graph.
- 'pcie-a100': 8x A100 80GB PCIe without NVLink bridges, in a common dual-switch layout:
  two PCIe switches of 4 GPUs each, each switch on one x16 uplink to the host CPU, so
  traffic between the two halves crosses the CPU.
PCIe rates are the PCI-SIG per-direction raw rates of an x16 link: Gen4 16 GT/s x 16 =
32e9 B/s, Gen5 32 GT/s x 16 = 64e9 B/s (128b/130b encoding leaves ~98%; measured
host-device copies reach ~25 / ~50 GB/s). Every GPU <-> host CPU, GPU <-> NIC and PCIe
switch link is one x16 link at that rate. Latencies are assumptions: 1 us per NVLink and
per PCIe edge (the existing single-node default), so GPU-to-GPU over a switch costs 2 us.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from .devices import canonical_device_name, get_device
from .errors import TopologyError
from .graph import BUILDERS, validate_topology

PCIE_GEN4_X16 = 32e9  # bytes/s per direction
PCIE_GEN5_X16 = 64e9  # bytes/s per direction


@dataclass(frozen=True)
class NodeKind:
    """A host model: its GPUs and how they are wired (see module docstring)."""

    name: str
    device: str  # canonical DeviceSpec name
    num_gpus: int
    gpu_switch: str  # 'nvswitch': all GPUs on one NVSwitch; 'pcie': on PCIe switches only
    pcie_bandwidth: float  # bytes/s per direction of each x16 PCIe link
    gpus_per_pcie_switch: int = 4  # 'pcie' kinds only


NODE_KINDS: dict[str, NodeKind] = {}
for _name, _device, _pcie in (("a100", "a100-80gb-sxm", PCIE_GEN4_X16),
                              ("h100", "h100-sxm", PCIE_GEN5_X16),
                              ("h200", "h200-sxm", PCIE_GEN5_X16)):
    for _brand in ("dgx", "hgx"):
        NODE_KINDS[f"{_brand}-{_name}"] = NodeKind(f"{_brand}-{_name}", _device, 8, "nvswitch", _pcie)
NODE_KINDS["pcie-a100"] = NodeKind("pcie-a100", "a100-80gb-pcie", 8, "pcie", PCIE_GEN4_X16)


def get_node_kind(name: str) -> NodeKind:
    """The NodeKind for `name` (case-insensitive, e.g. 'dgx-h100', 'pcie-a100')."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in NODE_KINDS:
        raise TopologyError(f"unknown node kind {name!r}; known: {', '.join(sorted(NODE_KINDS))}")
    return NODE_KINDS[key]


def add_link(graph: nx.DiGraph, a: str, b: str, bandwidth: float, latency: float, kind: str) -> None:
    graph.add_edge(a, b, bandwidth=bandwidth, latency=latency, kind=kind)
    graph.add_edge(b, a, bandwidth=bandwidth, latency=latency, kind=kind)


def add_host(
    graph: nx.DiGraph,
    kind: str | NodeKind,
    host: int,
    first_gpu_index: int,
    nics: bool = False,
    nvlink_latency: float = 1e-6,
    pcie_latency: float = 1e-6,
) -> list[str]:
    """Add host `host` of `kind` to `graph` in place; return its GPU ids in index order.

    GPUs are `gpu{first_gpu_index}`.. ; with `nics`, GPU i gets NIC `nic{i}` on its own
    PCIe link (the caller wires NICs to the network). Node ids: see `topologies.graph`.
    """
    spec = kind if isinstance(kind, NodeKind) else get_node_kind(kind)
    device = canonical_device_name(spec.device)
    cpu = f"host{host}"
    graph.add_node(cpu, type="host", host=host)
    gpus = [f"gpu{first_gpu_index + i}" for i in range(spec.num_gpus)]
    for i, gpu in enumerate(gpus):
        graph.add_node(gpu, type="gpu", device=device, index=first_gpu_index + i, host=host)
    if spec.gpu_switch == "nvswitch":
        nvswitch, nvlink = f"nvswitch{host}", get_device(device).nvlink_bandwidth
        graph.add_node(nvswitch, type="switch", host=host)
        for gpu in gpus:
            add_link(graph, gpu, nvswitch, nvlink, nvlink_latency, "nvlink")
            add_link(graph, gpu, cpu, spec.pcie_bandwidth, pcie_latency, "pcie")
    else:
        per_switch = spec.gpus_per_pcie_switch
        for k in range(0, spec.num_gpus, per_switch):
            switch = f"pcie{host}.{k // per_switch}"
            graph.add_node(switch, type="switch", host=host)
            add_link(graph, switch, cpu, spec.pcie_bandwidth, pcie_latency, "pcie")
            for gpu in gpus[k:k + per_switch]:
                add_link(graph, gpu, switch, spec.pcie_bandwidth, pcie_latency, "pcie")
    if nics:
        for i, gpu in enumerate(gpus):
            nic = f"nic{first_gpu_index + i}"
            graph.add_node(nic, type="nic", host=host)
            add_link(graph, gpu, nic, spec.pcie_bandwidth, pcie_latency, "pcie")
    return gpus


def node(
    kind: str = "dgx-h100",
    nics: bool = False,
    nvlink_latency: float = 1e-6,
    pcie_latency: float = 1e-6,
    name: str | None = None,
) -> nx.DiGraph:
    """One host of `kind` (NODE_KINDS) as a validated graph: GPUs, switches, host CPU `host0`.

    With `nics`, NICs `nic{i}` hang off the GPUs (unconnected beyond; for inspection).
    """
    spec = get_node_kind(kind)
    graph = nx.DiGraph(name=name or spec.name, num_nodes=1, gpus_per_node=spec.num_gpus, fabric=None)
    add_host(graph, spec, 0, 0, nics=nics, nvlink_latency=nvlink_latency, pcie_latency=pcie_latency)
    validate_topology(graph)
    return graph


BUILDERS["node"] = node
