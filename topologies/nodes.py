"""One host (a cluster node) of the topology graph: its GPUs, their NVSwitch, PCIe or direct
GPU-to-GPU links, the host CPU and, in clusters, one NIC per GPU. Units: bytes/s per
direction, s.

Node kinds (`NODE_KINDS`) and their sources:
- 'dgx-a100' / 'hgx-a100': 8x A100 80GB SXM on NVSwitch (NVLink3, 600 GB/s bidirectional
  = 300e9 B/s per direction per GPU), PCIe Gen4, 8x ConnectX-6 HDR (NVIDIA DGX A100
  datasheet / System Architecture whitepaper).
- 'dgx-h100' / 'hgx-h100', 'dgx-h200' / 'hgx-h200': 8x H100 / H200 SXM on NVSwitch
  (NVLink4, 900 GB/s bidirectional = 450e9 per direction), PCIe Gen5, 8x ConnectX-7 NDR
  (NVIDIA DGX H100 / DGX H200 datasheets). DGX and HGX are the same graph.
- 'dgx-b200' / 'hgx-b200': 8x B200 on NVSwitch (NVLink5, 1.8 TB/s bidirectional = 900e9 per
  direction; 14.4 TB/s for the 8), PCIe Gen5, 8x single-port ConnectX-7 400 Gb/s (NVIDIA
  DGX B200 datasheet; HGX B200 on NVIDIA's HGX page).
- 'gb200-nvl72': a GB200 NVL72 rack, 72 Blackwell GPUs (36 GB200 superchips of 1 Grace CPU
  + 2 GPUs, 18 compute trays of 4 GPUs) on one NVLink5 switch fabric (9 NVLink switch trays;
  130 TB/s = 1.8 TB/s per GPU, all-to-all; NVIDIA GB200 NVL72 specifications), modelled as
  ONE host: `host` is what the simulator treats as a node (the GPUs its intra-host
  collectives and the 'TP spans nodes' warning group together), and in an NVL72 that is
  the whole NVLink domain, as NCCL's multi-node NVLink treats it. The 18 trays and 36 Grace
  CPUs are therefore not separate hosts: the single `host0` CPU node stands for the Grace
  CPUs, each GPU linked to it by NVLink-C2C at 225e9 B/s per direction. NVIDIA publishes
  900 GB/s bidirectional per Grace (Grace CPU / GH200 pages) and no per-GPU figure; 225e9
  assumes a Grace's 450e9 per direction is shared evenly by its two GPUs. The 72 switch
  chips are one non-blocking `nvswitch0`. NICs: one 400 Gb/s ConnectX-7 per GPU (DGX GB200
  user guide: 4 per compute tray), each on a PCIe Gen5 x16 link (assumed, as in DGX B200).
- 'pcie-a100': 8x A100 80GB PCIe without NVLink bridges, in a common dual-switch layout:
  two PCIe switches of 4 GPUs each, each switch on one x16 uplink to the host CPU, so
  traffic between the two halves crosses the CPU. 'pcie-h100': the same with 8x H100 PCIe
  (Gen5). 'pcie-h100-nvl': the same with 8x H100 NVL, GPUs 2k and 2k+1 joined by their
  2-way NVLink bridge (600 GB/s bidirectional = 300e9 per direction, H100 datasheet).
- 'mi300x-8': the AMD Instinct MI300X platform, 8x MI300X as a fully connected mesh: every
  GPU pair on its own Infinity Fabric link (7 per GPU), 64e9 B/s per direction each (AMD's
  'peak 128 GB/s' per link read as bidirectional; `topologies.devices` says why), no switch,
  each GPU on a PCIe Gen5 x16 link to the host CPU (AMD MI300X datasheet and platform page).
PCIe rates are the PCI-SIG per-direction raw rates of an x16 link: Gen4 16 GT/s x 16 =
32e9 B/s, Gen5 32 GT/s x 16 = 64e9 B/s (128b/130b encoding leaves ~98%; measured
host-device copies reach ~25 / ~50 GB/s). Every GPU <-> host CPU (except GB200's C2C),
GPU <-> NIC and PCIe switch link is one x16 link at that rate. Latencies are assumptions:
1 us per NVLink / Infinity Fabric / C2C and per PCIe edge (the existing single-node
default), so GPU-to-GPU over a switch costs 2 us and over a direct link 1 us.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from .devices import canonical_device_name, get_device
from .errors import TopologyError
from .graph import BUILDERS, validate_topology

PCIE_GEN4_X16 = 32e9  # bytes/s per direction
PCIE_GEN5_X16 = 64e9  # bytes/s per direction
GRACE_C2C_PER_GPU = 900e9 / 2 / 2  # bytes/s per direction: a Grace's C2C shared by 2 GPUs
GPU_SWITCHES = ("nvswitch", "pcie", "mesh")


@dataclass(frozen=True)
class NodeKind:
    """A host model: its GPUs and how they are wired (see module docstring)."""

    name: str
    device: str  # canonical DeviceSpec name
    num_gpus: int
    # 'nvswitch': all GPUs on one NVLink switch; 'pcie': on PCIe switches only;
    # 'mesh': one direct link per GPU pair, nvlink_bandwidth / (num_gpus - 1) each.
    gpu_switch: str
    pcie_bandwidth: float  # bytes/s per direction of each x16 PCIe link
    gpus_per_pcie_switch: int = 4  # 'pcie' kinds only
    nvlink_pairs: bool = False  # 'pcie' kinds: GPUs 2k, 2k+1 joined by an NVLink bridge
    host_link_bandwidth: float | None = None  # GPU <-> host CPU, bytes/s; None: pcie_bandwidth
    host_link_kind: str = "pcie"  # edge kind of the GPU <-> host CPU links
    link_kind: str = "nvlink"  # edge kind of the GPU fabric ('xgmi': Infinity Fabric)

    def __post_init__(self) -> None:
        where = f"node kind {self.name!r}"
        if self.gpu_switch not in GPU_SWITCHES:
            raise TopologyError(f"{where}: gpu_switch must be one of {', '.join(GPU_SWITCHES)}, "
                                f"got {self.gpu_switch!r}")
        nvlink = get_device(self.device).nvlink_bandwidth
        if self.gpu_switch in ("nvswitch", "mesh") and not nvlink:
            raise TopologyError(f"{where}: gpu_switch {self.gpu_switch!r} needs a device with "
                                f"nvlink_bandwidth > 0; {self.device!r} has none")
        if self.gpu_switch == "mesh" and self.num_gpus < 2:
            raise TopologyError(f"{where}: num_gpus must be >= 2 for a 'mesh', got {self.num_gpus}")
        if self.nvlink_pairs and (self.gpu_switch != "pcie" or self.num_gpus % 2 or not nvlink):
            raise TopologyError(f"{where}: nvlink_pairs needs gpu_switch 'pcie', an even "
                                f"num_gpus and a device with NVLink bridges")

    @property
    def host_link(self) -> float:
        """Bytes/s per direction of each GPU's link to the host CPU."""
        return self.pcie_bandwidth if self.host_link_bandwidth is None else self.host_link_bandwidth


NODE_KINDS: dict[str, NodeKind] = {}
for _name, _device, _pcie in (("a100", "a100-80gb-sxm", PCIE_GEN4_X16),
                              ("h100", "h100-sxm", PCIE_GEN5_X16),
                              ("h200", "h200-sxm", PCIE_GEN5_X16),
                              ("b200", "b200", PCIE_GEN5_X16)):
    for _brand in ("dgx", "hgx"):
        NODE_KINDS[f"{_brand}-{_name}"] = NodeKind(f"{_brand}-{_name}", _device, 8, "nvswitch", _pcie)
NODE_KINDS["gb200-nvl72"] = NodeKind("gb200-nvl72", "gb200", 72, "nvswitch", PCIE_GEN5_X16,
                                     host_link_bandwidth=GRACE_C2C_PER_GPU,
                                     host_link_kind="nvlink-c2c")
NODE_KINDS["pcie-a100"] = NodeKind("pcie-a100", "a100-80gb-pcie", 8, "pcie", PCIE_GEN4_X16)
NODE_KINDS["pcie-h100"] = NodeKind("pcie-h100", "h100-pcie", 8, "pcie", PCIE_GEN5_X16)
NODE_KINDS["pcie-h100-nvl"] = NodeKind("pcie-h100-nvl", "h100-nvl", 8, "pcie", PCIE_GEN5_X16,
                                       nvlink_pairs=True)
NODE_KINDS["mi300x-8"] = NodeKind("mi300x-8", "mi300x", 8, "mesh", PCIE_GEN5_X16, link_kind="xgmi")


def get_node_kind(name: str) -> NodeKind:
    """The NodeKind for `name` (case-insensitive, e.g. 'dgx-h100', 'gb200-nvl72', 'mi300x-8')."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in NODE_KINDS:
        raise TopologyError(f"unknown node kind {name!r}; known: {', '.join(sorted(NODE_KINDS))}")
    return NODE_KINDS[key]


def add_link(graph: nx.DiGraph, a: str, b: str, bandwidth: float, latency: float, kind: str) -> None:
    attrs = link_attrs(bandwidth, latency, kind)
    graph.add_edge(a, b, **attrs)
    graph.add_edge(b, a, **attrs)


def link_attrs(bandwidth: float, latency: float, kind: str) -> dict:
    """The edge attributes of a link, as `add_link` sets them (one dict may serve many links)."""
    return {"bandwidth": bandwidth, "latency": latency, "kind": kind}


def add_parts(graph: nx.DiGraph, nodes: list, links: list) -> None:
    """Add `nodes` ((id, attrs)) to `graph`, then `links` ((a, b, attrs), ends already added)
    in order, each as edges a->b and b->a: the graph `graph.add_node` and `add_link` make.

    A plain DiGraph's dicts are written directly (as those methods do), without networkx's
    per-call overhead, which is most of the time a large cluster takes to build.
    """
    if type(graph) is not nx.DiGraph:
        for node, attrs in nodes:
            graph.add_node(node, **attrs)
        for a, b, attrs in links:
            add_link(graph, a, b, **attrs)
        return
    succ, pred, node_attrs = graph._succ, graph._pred, graph._node
    for node, attrs in nodes:
        if node in node_attrs:  # an existing node or edge: updated, as networkx does
            graph.add_node(node, **attrs)
        else:
            succ[node], pred[node], node_attrs[node] = {}, {}, dict(attrs)
    for a, b, attrs in links:
        if b in succ[a] or a in succ[b]:
            add_link(graph, a, b, **attrs)
        else:
            succ[a][b] = pred[b][a] = dict(attrs)
            succ[b][a] = pred[a][b] = dict(attrs)
    if cache := getattr(graph, "__networkx_cache__", None):  # as networkx's mutators do
        cache.clear()


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
    nvlink = get_device(device).nvlink_bandwidth
    cpu = f"host{host}"
    gpus = [f"gpu{first_gpu_index + i}" for i in range(spec.num_gpus)]
    nodes = [(cpu, {"type": "host", "host": host})]
    nodes += [(gpu, {"type": "gpu", "device": device, "index": first_gpu_index + i, "host": host})
              for i, gpu in enumerate(gpus)]
    links: list[tuple[str, str, dict]] = []
    fabric = link_attrs(nvlink, nvlink_latency, spec.link_kind)
    to_cpu = link_attrs(spec.host_link, pcie_latency, spec.host_link_kind)
    pcie = link_attrs(spec.pcie_bandwidth, pcie_latency, "pcie")
    if spec.gpu_switch == "nvswitch":
        nvswitch = f"nvswitch{host}"
        nodes.append((nvswitch, {"type": "switch", "host": host}))
        for gpu in gpus:
            links += ((gpu, nvswitch, fabric), (gpu, cpu, to_cpu))
    elif spec.gpu_switch == "mesh":
        mesh = link_attrs(nvlink / (spec.num_gpus - 1), nvlink_latency, spec.link_kind)
        for i, gpu in enumerate(gpus):
            links += [(gpu, other, mesh) for other in gpus[i + 1:]]
            links.append((gpu, cpu, to_cpu))
    else:
        per_switch = spec.gpus_per_pcie_switch
        for k in range(0, spec.num_gpus, per_switch):
            switch = f"pcie{host}.{k // per_switch}"
            nodes.append((switch, {"type": "switch", "host": host}))
            links.append((switch, cpu, pcie))
            links += [(gpu, switch, pcie) for gpu in gpus[k:k + per_switch]]
        if spec.nvlink_pairs:
            links += [(a, b, fabric) for a, b in zip(gpus[::2], gpus[1::2])]
    if nics:
        for i, gpu in enumerate(gpus):
            nic = f"nic{first_gpu_index + i}"
            nodes.append((nic, {"type": "nic", "host": host}))
            links.append((gpu, nic, pcie))
    add_parts(graph, nodes, links)
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
