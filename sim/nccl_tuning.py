"""NCCL's own cost model of a collective (its "tuning model"), which NCCL uses to pick the
algorithm and protocol of every call, re-stated from NCCL 2.30.7 src/graph/tuning.cc
(ncclTopoTuneModel, ncclTopoGetAlgoTime; tables ncclTunerConstantsDefaults,
nvlsEfficiency, treeCorrectionFactor). Pure arithmetic, no topology: `CommShape` holds
what NCCL's topology search would have found.

NCCL's estimate of one call of `nbytes` with algorithm a and protocol p (us, GB/s):
    time = latency[a][p] + nbytes / (1000 * algbw[a][p])
    algbw = busbw x ratio: ring, NVLS, NVLS-tree: n_ranks / nsteps; tree: 0.5;
            (all-gather / reduce-scatter other than ring: busbw itself)
    nsteps = 2(n-1) for all-reduce, n-1 for all-gather / reduce-scatter, n otherwise.
busbw starts as the graph's n_channels x bw (bw: per channel, intra-node for one or two
nodes, inter-node beyond) and is refined per (a, p) (`bus_bandwidth`): ring LL x0.5 (at most
llMaxBw), ring LL128 x0.92 (at most n_channels x perChMaxRingLL128Bw), tree all-reduce
x0.92 (at most n_channels x perChMaxTreeBw), tree LL 1/3.8, tree LL128 7/9 on one node
else 120/128, PAT x0.75; NVLS: per channel min(2 x bwIntra x nvlsEfficiency x (C-1)/C,
bwInter(x2 for NVLS-tree on 2 nodes), perChMaxNVLSTreeBw for NVLS-tree), the 2 for
all-reduce, (ppn-1)/ppn otherwise.
latency (`latency_us`): baseLat[a][p] plus per algorithm: ring
(nsteps - nInter) x intraLat + nInter x interLat (nInter = 2(nodes-1) for all-reduce,
nodes-1 else; intraLat at least the network post overhead, x3 for Simple, when on several
nodes); tree 2((ppn-1) intraLat + log2(nodes) interLat); NVLS intraLat (+ interLat on
several nodes, replacing the base); NVLS-tree intraLat + 2 log2(nodes) interLat; PAT
log2(nodes) interLat/3.5 + 2.8 n. intraLat = hwLat[NVLINK or PCI][a][p], interLat =
hwLat[NET][a][p] (the tree's when one GPU per node) + the graph's network latency, twice
for Simple. A multi-node ring Simple all-reduce pays 1.4x its latency (1.9x before SM80)
once the per-channel, per-rank chunk reaches 64 B ("plateau effect"); a tree all-reduce's
bandwidth is scaled by treeCorrectionFactor for sizes 64 B .. 256 MiB.

Enabled (NCCL's defaults): NVLS only on NVSwitch systems of SM90+ (and on one node unless
CollNet is enabled), NVLS-tree only on several nodes, CollNet only where the fabric has
in-network reduction (SHARP), PAT only with one GPU per node, LL128 by default on SM90+
(on SM80 only up to PXB paths, i.e. not across the network); broadcast and reduce run
rings only; all-gather and reduce-scatter run ring, NVLS, PAT or CollNet-direct; all-reduce
not PAT. Each default choice is the enabled (a, p) of least time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

ALGORITHMS = ("tree", "ring", "collnet-direct", "collnet-chain", "nvls", "nvls-tree", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")
HARDWARE = ("nvlink", "pci", "net")
ARCHS = ("volta", "ampere", "hopper", "blackwell")  # NCCL's compCapIndex order

BASE_LAT_US = {  # baseLatencies[a][p], us
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),
    "collnet-direct": (0, 0, 0), "collnet-chain": (0, 0, 0),
    "nvls": (0, 0, 0), "nvls-tree": (0, 0, 0), "pat": (8.0, 8.0, 8.0),
}
HW_LAT_US = {  # hwLatencies[hw][a][p], us
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
               "collnet-direct": (0, 0, 3.7), "collnet-chain": (0, 0, 2.8),
               "nvls": (0, 0, 25), "nvls-tree": (0, 0, 25), "pat": (0, 0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7),
            "collnet-direct": (0, 0, 3.7), "collnet-chain": (0, 0, 2.8),
            "nvls": (0, 0, 0), "nvls-tree": (0, 0, 0), "pat": (0, 0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0),
            "collnet-direct": (0, 0, 31), "collnet-chain": (0, 0, 30),
            "nvls": (0, 0, 18), "nvls-tree": (0, 0, 20.9), "pat": (0, 0, 14)},
}
# per architecture (rows: ARCHS) and node count (1, 2, >2 nodes), GB/s
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0),
             (282.0, 90.0, 70.0))
"""llMaxBws: row by GPU architecture on one node; on several nodes row 0 for an Intel host
CPU, row 1 for AMD (NCCL: "for multi-node, we look at CPU type")."""
PER_CH_MAX_RING_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7),
                            (40.0, 40.0, 40.0))
PER_CH_MAX_TREE_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0),
                            (55.6, 31.67, 20.0))
PER_CH_MAX_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0),
                      (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5),
                           (0.0, 96.0, 80.0))
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)
TREE_CORRECTION = (  # treeCorrectionFactor[p][log2(nbytes / 64)], 64 B .. 256 MiB
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9,
     1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9,
     .9, .9),
)
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}  # getNetOverhead, x86 hosts
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce")


@dataclass(frozen=True)
class CommShape:
    """What NCCL knows of a communicator when it tunes (units: GB/s = 1e9 B/s, us).

    `bw_intra` / `bw_inter`: the graph's bandwidth per channel inside a node and across
    nodes; `channels`: its channel count (n_channels x bw is what one GPU moves);
    `intra`: 'nvlink' or 'pci' (the graph's intra-node link type); `nvls`: NVLink SHARP
    is available (an NVSwitch of SM90+); `collnet`: in-network reduction (SHARP) is;
    `cpu`: the host CPU vendor ('intel' or 'amd'); `net_latency_us`: the graph's
    latencyInter (0 unless the network adds one); `nvls_channels`, `nvls_bw_intra`,
    `nvls_bw_inter`: the NVLS graph's channels (one head per GPU of a node) and
    bandwidths per channel (inside a node a channel takes its bandwidth on every
    GPU-switch link and twice on its head's: (ppn + 1) x bw per GPU)."""

    n_ranks: int
    n_nodes: int
    compute_capability: tuple[int, int]
    intra: str
    bw_intra: float
    bw_inter: float
    channels: int
    nvls_channels: int = 0
    nvls: bool = False
    collnet: bool = False
    cpu: str = "intel"
    net_latency_us: float = 0.0
    nvls_bw_intra: float = 0.0
    nvls_bw_inter: float = math.inf

    @property
    def arch(self) -> int:
        cc = self.compute_capability[0] * 10 + self.compute_capability[1]
        return 3 if cc >= 100 else 2 if cc >= 90 else 1 if cc >= 80 else 0

    @property
    def node_index(self) -> int:
        return min(self.n_nodes, 3) - 1

    @property
    def ppn(self) -> float:
        return self.n_ranks / self.n_nodes


def nsteps(coll: str, n: int) -> int:
    return 2 * (n - 1) if coll == "all-reduce" else n - 1 if coll in (
        "all-gather", "reduce-scatter") else n


def runs(coll: str, algorithm: str, protocol: str) -> bool:
    """Whether NCCL has (algorithm, protocol) for this collective at all."""
    if coll in ("broadcast", "reduce") and algorithm != "ring":
        return False
    if coll in ("all-gather", "reduce-scatter") and algorithm not in (
            "pat", "ring", "nvls", "collnet-direct"):
        return False
    if coll == "all-reduce" and algorithm == "pat":
        return False
    if algorithm in ("nvls", "nvls-tree", "pat", "collnet-direct", "collnet-chain"):
        return protocol == "Simple"
    return True


def enabled(coll: str, algorithm: str, protocol: str, shape: CommShape) -> bool:
    """NCCL's default enablement of (algorithm, protocol) on this communicator."""
    if not runs(coll, algorithm, protocol):
        return False
    if algorithm in ("nvls", "nvls-tree") and (not shape.nvls or shape.nvls_channels < 2):
        return False
    if algorithm == "nvls-tree" and shape.n_nodes == 1:
        return False
    if algorithm == "nvls" and shape.n_nodes > 1 and not shape.collnet:
        return False
    if algorithm == "nvls" and shape.n_nodes > 1 and coll != "all-reduce":
        return False  # multi-node NVLS all-gather / reduce-scatter need CollNet's ops
    if algorithm.startswith("collnet") and not shape.collnet:
        return False
    if algorithm == "collnet-direct" and coll != "all-reduce":
        return False
    if algorithm == "pat" and shape.n_nodes != shape.n_ranks:
        return False
    if protocol == "LL128":
        # on by default on SM90+ (all paths up to PXN); before, only within PXB paths
        return shape.arch >= 2 or shape.n_nodes == 1
    return True


def raw_bus_bandwidth(algorithm: str, shape: CommShape) -> float:
    """The graph's channels x bw of a ring, tree, PAT or CollNet algorithm, GB/s: bwIntra
    up to two nodes (and for CollNet), bwInter beyond; NCCL's refinements scale it."""
    collnet = algorithm.startswith("collnet")
    return shape.channels * (shape.bw_intra if shape.n_nodes <= 2 or collnet
                             else shape.bw_inter)


def bus_bandwidth(coll: str, algorithm: str, protocol: str, shape: CommShape) -> float:
    """NCCL's bus bandwidth of (algorithm, protocol), GB/s, before the algbw ratio."""
    arch, nodes = shape.arch, shape.node_index
    channels = shape.nvls_channels if algorithm.startswith("nvls") else shape.channels
    if algorithm in ("nvls", "nvls-tree"):
        intra = nvls_geometry(coll, shape) * NVLS_EFFICIENCY[arch]
        inter = shape.nvls_bw_inter * (2 if shape.n_nodes <= 2 and algorithm == "nvls-tree"
                                       else 1)
        bus = channels * min(intra, inter, nvls_cap(algorithm, shape))
    else:
        bus = raw_bus_bandwidth(algorithm, shape)
    ll_row = arch if shape.n_nodes == 1 else (1 if shape.cpu == "amd" else 0)
    if algorithm == "ring" and protocol == "LL":
        bus = min(LL_MAX_BW[ll_row][nodes], bus * 0.5)
    if algorithm == "ring" and protocol == "LL128":
        bus = min(bus * 0.92, channels * PER_CH_MAX_RING_LL128_BW[arch][nodes])
    if algorithm == "tree" and coll == "all-reduce":
        bus = min(bus * 0.92, channels * PER_CH_MAX_TREE_BW[arch][nodes])
    if algorithm == "tree" and protocol == "LL":
        bus = min(bus / 3.8, LL_MAX_BW[ll_row][nodes])
    if algorithm == "tree" and protocol == "LL128":
        bus = min(bus * (7 / 9 if shape.n_nodes == 1 else 120 / 128),
                  channels * PER_CH_MAX_TREE_LL128_BW[arch][nodes])
    if algorithm == "pat":
        bus *= 0.75
    if algorithm == "collnet-direct":
        factor = shape.ppn / channels
        bus /= factor - (factor - 1) / 2
        if arch >= 2:
            bus *= 0.85
    return bus


def nvls_geometry(coll: str, shape: CommShape) -> float:
    """NVLS's bandwidth per channel before its efficiency, GB/s: bwIntra x (C-1)/C, x2 for
    an all-reduce (two operations pipelined), x(ppn-1)/ppn otherwise."""
    c = shape.nvls_channels
    return shape.nvls_bw_intra * (c - 1) / c * (2.0 if coll == "all-reduce"
                                                 else (shape.ppn - 1) / shape.ppn)


def nvls_cap(algorithm: str, shape: CommShape) -> float:
    """perChMaxNVLSTreeBw for NVLS-tree (GB/s per channel), none for NVLS."""
    if algorithm != "nvls-tree":
        return math.inf
    return PER_CH_MAX_NVLS_TREE_BW[shape.arch][shape.node_index]


def algorithm_bandwidth(coll: str, algorithm: str, protocol: str, shape: CommShape) -> float:
    """NCCL's `bandwidths[coll][a][p]`: the bus bandwidth times its ratio, GB/s."""
    bus = bus_bandwidth(coll, algorithm, protocol, shape)
    if algorithm != "ring" and coll in ("all-gather", "reduce-scatter"):
        return bus
    if algorithm in ("ring", "nvls", "nvls-tree"):
        return bus * shape.n_ranks / nsteps(coll, shape.n_ranks)
    return bus * 0.5


def latency_us(coll: str, algorithm: str, protocol: str, shape: CommShape) -> float:
    """NCCL's `latencies[coll][a][p]`, us (module docstring)."""
    p = PROTOCOLS.index(protocol)
    n, nodes, ppn = shape.n_ranks, shape.n_nodes, shape.ppn
    intra = HW_LAT_US[shape.intra][algorithm][p]
    inter = HW_LAT_US["net"]["tree" if ppn == 1 else algorithm][p] + shape.net_latency_us
    if protocol == "Simple":
        inter += shape.net_latency_us
    lat = BASE_LAT_US[algorithm][p]
    log_nodes = int(math.log2(nodes))
    if algorithm == "ring":
        steps = nsteps(coll, n)
        if coll in ("broadcast", "reduce"):
            return one_hop_ring_us(protocol, shape)  # NCCL's "sameChannels" ring graphs
        overhead = 0.0
        if nodes > 1:
            overhead = NET_OVERHEAD_US[shape.cpu] * (3 if protocol == "Simple" else 1)
        intra = max(intra, overhead)
        n_inter = 0 if nodes == 1 else 2 * (nodes - 1) if coll == "all-reduce" else nodes - 1
        return lat + (steps - n_inter) * intra + n_inter * inter
    if algorithm == "tree":
        return lat + (2 * ((n // nodes - 1) * intra + log_nodes * inter)
                      if coll == "all-reduce" else 0.0)
    if algorithm == "collnet-direct":
        return lat + 2 * (min(1, n // nodes - 1) * intra + (n // nodes - 1) * 0.4) + inter
    if algorithm == "collnet-chain":
        return lat + 2 * (n // nodes - 1) * intra + inter
    if algorithm == "nvls":
        return intra + (inter if nodes > 1 else 0.0)
    if algorithm == "nvls-tree":
        return lat + intra + 2 * log_nodes * inter
    if algorithm == "pat":
        return lat + (log_nodes * (inter / 3.5) + n * 2.8
                      if coll in ("all-gather", "reduce-scatter") else 0.0)
    raise ValueError(algorithm)


def one_hop_ring_us(protocol: str, shape: CommShape) -> float:
    """NCCL's latency of a ring operation of one hop (its broadcast and reduce), us:
    baseLat[ring][p] + hwLat[hw][ring][p], hw the intra-node link type on one node, the
    network's on several."""
    p = PROTOCOLS.index(protocol)
    return (BASE_LAT_US["ring"][p]
            + HW_LAT_US[shape.intra if shape.n_nodes == 1 else "net"]["ring"][p])


# --- send/recv (and all-to-all, which NCCL runs as grouped send/recv) -------------------------
P2P_LL_THRESHOLD = 16384
"""Bytes per peer up to which NCCL sends with LL (NCCL_P2P_LL_THRESHOLD's default, NCCL
2.30.7 src/enqueue.cc; Simple above it; send/recv never uses LL128)."""


P2P_EFFICIENCY = {"LL": 0.5, "Simple": 1.0}
"""The share of a link's bandwidth a send/recv's bytes get: LL writes 4 bytes of data
with a 4-byte flag in each 8-byte line (the 0.5 of NCCL's ring LL bus bandwidth)."""


def p2p_protocol(nbytes_per_peer: float) -> str:
    """The protocol of NCCL's send/recv of `nbytes_per_peer` (P2P_LL_THRESHOLD)."""
    return "LL" if nbytes_per_peer <= P2P_LL_THRESHOLD else "Simple"


def p2p_latency_us(protocol: str, shape: CommShape) -> float:
    """The latency charged to a send/recv (and to an all-to-all, its peers' send/recvs in
    parallel), us. NCCL has no cost model of send/recv (its tuning tables leave Send/Recv
    out: NCCL_NUM_FUNCTIONS, src/include/nccl_common.h); assumed here: its model's latency
    of a one-hop ring operation of the same protocol (`one_hop_ring_us`): 7.2 us with LL
    on NVLink, 11.8 us with Simple; 9.3 and 22.4 us across nodes. Measured (DeepEP issue
    303, 8x H20 over NVLink, nccl-tests alltoall_perf): 10.6 us at 128 B, 11.1 us at 4
    KiB (benchmarks/results/nccl_tests.md)."""
    return one_hop_ring_us(protocol, shape)


def tree_correction(protocol: str, nbytes: float, limit: int = 23) -> float:
    """treeCorrectionFactor for a tree all-reduce of `nbytes` (1 outside 64 B .. 2^limit x 64 B)."""
    log_size = int(nbytes // 64).bit_length() - 1 if nbytes >= 64 else -1
    if 0 <= log_size < limit:
        return TREE_CORRECTION[PROTOCOLS.index(protocol)][log_size]
    return 1.0


def latency_with_plateau_us(coll: str, algorithm: str, protocol: str, nbytes: float,
                            shape: CommShape) -> float:
    """`latency_us`, x1.4 (x1.9 before SM80) for a multi-node ring Simple all-reduce whose
    chunk per channel and rank reaches 64 B (NCCL: "plateau effect of ring")."""
    lat = latency_us(coll, algorithm, protocol, shape)
    if (algorithm == "ring" and protocol == "Simple" and shape.n_nodes > 1
            and coll == "all-reduce" and nbytes / (shape.channels * shape.n_ranks) >= 64):
        lat *= 1.4 if shape.arch >= 1 else 1.9
    return lat


def time_us(coll: str, algorithm: str, protocol: str, nbytes: float, shape: CommShape
            ) -> float:
    """NCCL's ncclTopoGetAlgoTime for one call (numPipeOps 1), us; inf when disabled."""
    if not enabled(coll, algorithm, protocol, shape):
        return math.inf
    bw = algorithm_bandwidth(coll, algorithm, protocol, shape)
    if bw <= 0:
        return math.inf
    if algorithm == "tree" and coll == "all-reduce":
        bw *= tree_correction(protocol, nbytes)
    if algorithm == "nvls-tree" and coll == "all-reduce" and shape.arch >= 3:
        bw *= tree_correction(protocol, nbytes, 24)
    return latency_with_plateau_us(coll, algorithm, protocol, nbytes, shape) + nbytes / (
        1000 * bw)


def choose(coll: str, nbytes: float, shape: CommShape, algorithm: str | None = None,
           protocol: str | None = None, among: tuple[str, ...] = ALGORITHMS
           ) -> tuple[str, str, float]:
    """(algorithm, protocol, NCCL's time in us) of least NCCL time among the enabled
    pairs of algorithms in `among`, restricted to `algorithm` / `protocol` when given
    (NCCL_ALGO / NCCL_PROTO). Ties go to the first in NCCL's order (algorithms as
    ALGORITHMS, protocols as PROTOCOLS). ValueError if nothing is left."""
    best = None
    for a in [x for x in ALGORITHMS if x in among] if algorithm is None else (algorithm,):
        for p in PROTOCOLS if protocol is None else (protocol,):
            t = time_us(coll, a, p, nbytes, shape)
            if t < math.inf and (best is None or t < best[2]):
                best = (a, p, t)
    if best is None:
        raise ValueError(f"NCCL runs no {algorithm or 'algorithm'} with "
                         f"{protocol or 'any protocol'} for {coll} on this communicator")
    return best
