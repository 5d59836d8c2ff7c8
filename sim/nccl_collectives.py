"""Collectives as NCCL runs them: NCCL's choice of algorithm and protocol (sim.nccl_tuning)
for a group of GPUs on a topology, and that choice as phases of flows.

The communicator NCCL would see (`comm_shape`), from the topology (bandwidths achievable,
sim.link_capacity):
- one host: CHANNELS_ONE_NODE ring/tree channels sharing the GPU's NVLink bandwidth
  (its PCIe where it has none);
- several hosts: one channel per NIC of the group's GPUs on a host, each at the NIC's
  achievable bandwidth (NCCL's search on 8 NICs of 400 Gb/s: 8 channels of 48 GB/s;
  bwIntra = bwInter);
- NVLS (SM90+ GPUs on an NVSwitch, at least 2 per host and as many on every host; NVLS
  with uneven hosts is not modelled, so it is left out there): one channel (head) per GPU of a
  host, each with bwIntra = the GPU's NVLink / (ppn + 1) (NCCL: a channel takes its
  bandwidth on every GPU-switch link and twice on its head's; 8x H100: 8 x 40 GB/s) and
  bwInter = a GPU's NIC;
- host CPU vendor (the network post overhead, the LL ceiling across nodes) by GPU: AMD
  before SM90 (DGX A100: 2x AMD EPYC 7742), Intel from SM90 (DGX H100 / H200 / B200:
  Intel Xeon 8480C / 8570). Assumptions, not measured.
NCCL's topology search itself is not re-run: the shape above is what it reaches on the
balanced NVSwitch and rail-NIC systems clustersim builds.

How an (algorithm, protocol) runs (`nccl_phases`): the algorithm's flows
(sim.collective_algorithms; NCCL's ring is `ring` on one host and `multi-ring` (one ring
per channel leaving each host through a different NIC) on several, its tree `nccl_tree`
(chains inside hosts, the double binary tree of hosts), NVLS and NVLS-tree `nvls` and
`nvls_tree`), in one phase that waits NCCL's
latency of the pair and whose bytes are divided by the pair's efficiency: the fraction
of the links' bandwidth its bytes get, NCCL's bus bandwidth of the pair over the raw
channels x bw (LL 0.5, LL128 0.92, ...; NVLS nvlsEfficiency x (C-1)/C; the tree's
size-dependent correction; NVLS-tree and CollNet chain: on their switch legs only,
`SWITCH_SHARE`). So an uncontended ring of size S on n GPUs takes
    latency + 2(n-1)/n x S / (B x efficiency)
with B the achievable link bandwidth; flows share links with all other traffic.
All-to-all and send/recv (`p2p_phases`), which NCCL runs as send/recv to each peer and
does not cost in its tuner, run direct: one flow per peer pair, the protocol by NCCL's P2P
LL threshold, the latency as assumed in sim.nccl_tuning.p2p_latency_us.
PAT (all-gather and reduce-scatter with one GPU per node, NCCL's default there) runs as
`pat`'s log-distance flows. CollNet chain (an all-reduce through InfiniBand SHARP, on
topologies with `in_network_reduction`) runs only when asked for (`--algorithm
collnet-chain`), as NCCL only uses CollNet with NCCL_COLLNET_ENABLE=1; CollNet direct
and NVLS with SHARP across nodes are not modelled.
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Sequence

import networkx as nx

from clustersim.schedules.errors import ConfigError
from clustersim.topologies import get_device

from . import collective_algorithms as algos
from . import nccl_tuning as tuning
from .collective_algorithms import Phase
from .link_capacity import out_capacity

CHANNELS_ONE_NODE = 12
"""Ring and tree search channels of one node: NCCL 2.30.7's graph search on 8x H100
(18 NVLinks x 20.6 GB/s) finds 12 channels of 30 GB/s (traced by hand from
src/graph/search.cc; the 24 collective channels of NCCL's INFO log on a p5.48xlarge are
these doubled at run time); assumed for every NVLink node. Their bandwidth together is
taken as the GPU's achievable NVLink bandwidth (360 GB/s in NCCL, 370.8 here)."""
MODELLED = ("ring", "tree", "nvls", "nvls-tree", "pat", "collnet-chain")
COLLNET = ("collnet-chain",)
SWITCH_SHARE = ("nvls-tree", "collnet-chain")
"""Algorithms whose efficiency applies to their flows to and from a switch only: NVLS-tree's
NVSwitch legs (its trees' NIC flows run at their own share), CollNet chain's legs to the
SHARP switch (its NVLink chains run at theirs)."""
TUNED = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce")
SEND_RECV = ("all-to-all", "p2p")  # what NCCL runs as send/recv: `p2p_phases`
_SHAPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> {gpus: shape}
UNAVAILABLE = {
    "nvls": "NVLS needs SM90+ GPUs, at least 2 per host on an NVSwitch, and across hosts "
            "CollNet, which is not modelled: use nvls-tree",
    "nvls-tree": "NVLS-tree needs several hosts of SM90+ GPUs, at least 2 per host on an "
                 "NVSwitch",
    "pat": "PAT runs all-gather and reduce-scatter with one GPU per node only",
    "collnet-chain": "CollNet needs several hosts of as many GPUs each, each GPU with a NIC, "
                     "on a fabric with in_network_reduction (SHARP), and runs all-reduce "
                     "only",
    None: "NVLS algorithms and PAT only run Simple, and LL128 is off across hosts before SM90",
}
PROTOCOL_NAMES = {p.lower(): p for p in tuning.PROTOCOLS}


def parse_protocol(protocol: str | None) -> str | None:
    """'ll', 'LL128', 'simple', ... -> NCCL's spelling; ConfigError names the known ones."""
    if protocol is None:
        return None
    key = str(protocol).strip().lower()
    if key not in PROTOCOL_NAMES:
        raise ConfigError(f"protocol must be one of {', '.join(tuning.PROTOCOLS)}, "
                          f"got {protocol!r}")
    return PROTOCOL_NAMES[key]


def _switch(graph: nx.DiGraph, gpu: str) -> str | None:
    """The NVSwitch `gpu` hangs on (an NVLink neighbour of type switch), or None."""
    nodes = graph._node  # plain dicts: this runs once per GPU of a 16k-GPU group
    return next((v for v, link in graph._succ[gpu].items()
                 if nodes[v].get("type") == "switch" and link["kind"] == "nvlink"), None)


def _leaf(graph: nx.DiGraph, gpu: str) -> str:
    """The switch `gpu`'s NIC hangs on (where SHARP reduces its traffic)."""
    nic = next(v for v in graph.successors(gpu) if graph.nodes[v].get("type") == "nic")
    return next(v for v in graph.successors(nic) if graph.nodes[v].get("type") == "switch")


def _nic_bandwidth(graph: nx.DiGraph, gpu: str) -> float:
    """Achievable bytes/s of the NIC(s) on `gpu`'s PCIe links toward the network."""
    nodes = graph._node
    return sum(out_capacity(graph, nic, ("ib", "roce")) for nic in graph._succ[gpu]
               if nodes[nic].get("type") == "nic")


def comm_shape(graph: nx.DiGraph, gpus: Sequence[str]) -> tuning.CommShape | None:
    """The communicator NCCL would tune for `gpus` (module docstring), or None where
    NCCL's model does not apply (a GPU without a CUDA compute capability). Cached per
    graph object and GPU tuple (a replay asks for the same groups thousands of times)."""
    shapes = _SHAPES.setdefault(graph, {})
    key = tuple(gpus)
    if key not in shapes:
        shapes[key] = _comm_shape(graph, key)
    return shapes[key]


def _comm_shape(graph: nx.DiGraph, gpus: Sequence[str]) -> tuning.CommShape | None:
    attrs = graph._node  # plain dicts: once per GPU of a 16k-GPU group
    devices = [get_device(name) for name in {attrs[g]["device"] for g in gpus}]
    if any(d.compute_capability is None for d in devices):
        return None
    cc = min(d.compute_capability for d in devices)
    by_host: dict[int, list[str]] = {}
    for g in gpus:
        by_host.setdefault(attrs[g]["host"], []).append(g)
    nodes, ppn = len(by_host), min(len(h) for h in by_host.values())
    nvlink = min(out_capacity(graph, g, ("nvlink",)) for g in gpus) / 1e9
    intra = "nvlink" if nvlink > 0 else "pci"
    local = nvlink if nvlink > 0 else min(out_capacity(graph, g, ("pcie",)) for g in gpus) / 1e9
    nic = min(_nic_bandwidth(graph, g) for g in gpus) / 1e9
    if nodes == 1:
        channels, bw_intra, bw_inter = CHANNELS_ONE_NODE, local / CHANNELS_ONE_NODE, math.inf
    else:
        if nic <= 0:
            return None  # hosts without NICs: nothing NCCL's network model applies to
        channels = ppn
        bw_intra = bw_inter = min(nic, local)
    even = len({len(h) for h in by_host.values()}) == 1
    nvls = cc >= (9, 0) and ppn >= 2 and even and all(_switch(graph, g) for g in gpus)
    return tuning.CommShape(
        len(gpus), nodes, cc, intra, bw_intra, bw_inter, channels,
        nvls_channels=ppn if nvls else 0, nvls=nvls, cpu="amd" if cc < (9, 0) else "intel",
        nvls_bw_intra=nvlink / (ppn + 1), nvls_bw_inter=nic if nodes > 1 else math.inf,
        collnet=nodes > 1 and even and bool(graph.graph.get("in_network_reduction")))


def efficiency(coll: str, algorithm: str, protocol: str, nbytes: float,
               shape: tuning.CommShape) -> float:
    """The fraction of the links' bandwidth the pair's bytes get (module docstring): NCCL's
    bus bandwidth over the raw channels x bw; for NVLS its efficiency (the flows already
    carry its bytes per GPU), for NVLS-tree also at most its per-channel ceiling (the
    inter-node limit is the flows' own)."""
    if algorithm == "nvls":
        return tuning.NVLS_EFFICIENCY[shape.arch]
    if algorithm == "collnet-chain":
        # NCCL's algbw = channels x bwIntra x 0.5 (its ratio for algorithms other than
        # the ring): each channel's network leg, S/g to the SHARP switch and back, runs at
        # that share; the NVLink chains are the flows' own
        return (tuning.algorithm_bandwidth(coll, algorithm, protocol, shape)
                / tuning.raw_bus_bandwidth(algorithm, shape))
    if algorithm == "nvls-tree":
        # perChMaxNVLSTreeBw caps NCCL's bus bandwidth at channels x cap; the flows, NVLink
        # bound, reach 2(n-1)/n x ppn x bwIntra at a share of 1 (nvls_tree's docstring)
        n = shape.n_ranks
        eff = min(tuning.NVLS_EFFICIENCY[shape.arch],
                  tuning.nvls_cap(algorithm, shape) * n / (2 * (n - 1) * shape.nvls_bw_intra))
        if coll == "all-reduce" and shape.arch >= 3:
            eff *= tuning.tree_correction(protocol, nbytes, 24)
        return eff
    eff = (tuning.bus_bandwidth(coll, algorithm, protocol, shape)
           / tuning.raw_bus_bandwidth(algorithm, shape))
    if algorithm == "tree" and coll == "all-reduce":
        eff *= tuning.tree_correction(protocol, nbytes)
    return eff


def as_configured(shape: tuning.CommShape, algorithm: str | None) -> tuning.CommShape:
    """`shape` with CollNet on only when `algorithm` asks for it: NCCL leaves CollNet off
    unless NCCL_COLLNET_ENABLE=1, even on a fabric with SHARP."""
    return shape if algorithm in COLLNET else dataclasses.replace(shape, collnet=False)


def nccl_phases(coll: str, gpus: Sequence[str], nbytes: float, graph: nx.DiGraph,
                shape: tuning.CommShape, algorithm: str | None = None,
                protocol: str | None = None) -> tuple[str, list[Phase]]:
    """('algorithm/protocol', phases) of NCCL's choice for `coll` of `nbytes` on `gpus`,
    restricted to `algorithm` / `protocol` where given (module docstring)."""
    shape = as_configured(shape, algorithm)
    try:
        algo, proto, _ = tuning.choose(coll, nbytes, shape, algorithm, protocol,
                                       among=MODELLED)
    except ValueError:
        if algorithm and protocol and not tuning.runs(coll, algorithm, protocol):
            raise ConfigError(f"protocol={protocol}: NCCL runs {algorithm} with Simple "
                              f"only") from None
        raise ConfigError(f"algorithm={algorithm or 'auto'}, protocol={protocol or 'auto'}: "
                          f"NCCL does not run it for {coll} on these {shape.n_ranks} GPUs "
                          f"({UNAVAILABLE.get(algorithm, UNAVAILABLE[None])})") from None
    flows = _flows(coll, algo, gpus, nbytes, graph)
    eff = efficiency(coll, algo, proto, nbytes, shape)
    if algo in SWITCH_SHARE:  # the share is the switch legs'; GPU-to-GPU flows run Simple
        flows = [(a, b, n / eff if graph.nodes[a]["type"] == "switch"
                  or graph.nodes[b]["type"] == "switch" else n) for a, b, n in flows]
    else:
        flows = [(a, b, n / eff) for a, b, n in flows]
    latency = tuning.latency_with_plateau_us(coll, algo, proto, nbytes, shape) * 1e-6
    phase = Phase(tuning.nsteps(coll, len(gpus)), flows, latency)
    return f"{algo}/{proto}", [phase]


def p2p_phases(coll: str, gpus: Sequence[str], nbytes: float, shape: tuning.CommShape,
               protocol: str | None = None) -> tuple[str, list[Phase]]:
    """('direct/protocol', phases) of NCCL's send/recv ('p2p': gpus[0] to gpus[1]) or
    all-to-all (every GPU to every other, nbytes / n each) of `nbytes`: the direct flows in
    one phase that waits NCCL's send/recv latency as assumed (tuning.p2p_latency_us), with
    the protocol NCCL picks by the bytes per peer and its share of the links. `protocol`,
    where given (a choice reported earlier), must be that one: NCCL_PROTO does not choose
    send/recv's."""
    per_peer = nbytes if coll == "p2p" else nbytes / len(gpus)
    picked = tuning.p2p_protocol(per_peer)
    if protocol not in (None, picked):
        raise ConfigError(f"protocol={protocol}: NCCL sends {coll} with {picked} at "
                          f"{per_peer:g} bytes per peer (LL up to its P2P LL threshold of "
                          f"{tuning.P2P_LL_THRESHOLD} bytes, Simple above); no other applies")
    protocol = picked
    eff = tuning.P2P_EFFICIENCY[protocol]
    flows = [(a, b, n / eff) for phase in algos.direct(coll, gpus, nbytes)
             for a, b, n in phase.flows]
    return f"direct/{protocol}", [Phase(1, flows, tuning.p2p_latency_us(protocol, shape) * 1e-6)]


def _flows(coll: str, algorithm: str, gpus: Sequence[str], nbytes: float,
           graph: nx.DiGraph) -> list[algos.FlowSpec]:
    host_of = {g: graph.nodes[g]["host"] for g in gpus}
    if algorithm == "ring":
        several = len(set(host_of.values())) > 1
        try:
            phases = (algos.multi_ring(coll, gpus, nbytes, host_of) if several
                      else algos.ring(coll, gpus, nbytes))
        except ConfigError:  # hosts with one GPU each, or unequal: one ring
            phases = algos.ring(coll, gpus, nbytes)
    elif algorithm == "tree":
        phases = algos.nccl_tree(coll, gpus, nbytes, host_of)
    elif algorithm == "pat":
        phases = algos.pat(coll, gpus, nbytes)
    elif algorithm == "collnet-chain":
        phases = algos.collnet_chain(coll, gpus, nbytes, host_of,
                                     {g: _leaf(graph, g) for g in gpus})
    elif algorithm == "nvls":
        phases = algos.nvls(coll, gpus, nbytes, {g: _switch(graph, g) for g in gpus})
    else:
        phases = algos.nvls_tree(coll, gpus, nbytes, host_of,
                                 {g: _switch(graph, g) for g in gpus})
    return [f for phase in phases for f in phase.flows]
