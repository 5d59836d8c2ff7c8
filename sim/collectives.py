"""Collectives as algorithms over the flow network (sim.flows): choose an algorithm, run
its phases as flows, and report the nccl-tests bandwidths.

Units: bytes, seconds, bytes/s (`algbw`, `busbw`; printed as GB/s = 1e9 bytes/s, as
nccl-tests does). Sizes and bus-bandwidth factors follow nccl-tests doc/PERFORMANCE.md;
see sim.collective_algorithms for what S means per op and for the algorithms.

Running: each phase starts its flows together through `FlowNetwork.start` after
`steps * alpha`, alpha being the largest route latency among the phase's flows, so an
uncontended phase takes steps*alpha + bytes/bandwidth, and contention comes from the
flows sharing links (with each other and with any other traffic on the network).

Default algorithm (`algorithm=None`): on CUDA GPUs, NCCL's own choice of algorithm and
protocol, run as NCCL runs it (sim.nccl_collectives: one pipelined phase paying NCCL's
latency once, its bytes scaled by the protocol's share of the links; all-to-all and p2p
run direct, as NCCL's send/recv, with the latency assumed for them: p2p_phases). Elsewhere
(and for the what-if hierarchical algorithm) the alpha-beta model: the applicable
algorithm with the smallest alpha-beta estimate, sum over phases of
    steps * alpha + max over links (bytes the phase puts on the link / link bandwidth),
with each flow's bytes spread evenly over its equal-cost routes (ideal ECMP) and no other
traffic (an algorithm whose lower bound, from a sample of its flows, already loses is not
estimated: `_fastest`). That is exact for an uncontended ring, and counts the links an algorithm's own
flows share (e.g. a tree node sending to its parent and two children). Ties go to the
first in APPLICABLE order. So, like NCCL's tuner, small all-reduces get the tree
(log-depth latency) and large ones the ring, broadcasts and reduces the ring (AUTOMATIC:
the only algorithm NCCL runs them with); across hosts, the largest get the
multi-ring (NCCL's channels: every GPU's NIC busy, NVLink and network overlapped) and
smaller all-gathers / reduce-scatters the hierarchical one (fewest latency steps).
ALGORITHMS and APPLICABLE register them (docs/architecture.md, "Add a collective
algorithm").
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import networkx as nx
import simpy

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.names import COLLECTIVE_LANE
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.timeline import Span, Timeline
from clustersim.topologies import gpu_nodes, load_topology

from . import collective_algorithms as algos
from .collective_algorithms import Phase, estimate_lower_bound, estimate_time, paid_latency
from . import nccl_tuning as tuning
from .flows import FlowNetwork
from .nccl_collectives import (SEND_RECV, TUNED, comm_shape, nccl_phases, p2p_phases,
                               parse_protocol)


class Collective(str, Enum):
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_TO_ALL = "all-to-all"
    P2P = "p2p"

    def busbw_factor(self, n: int) -> float:
        """nccl-tests' busbw / algbw for n ranks."""
        if self is Collective.ALL_REDUCE:
            return 2 * (n - 1) / n
        if self in (Collective.BROADCAST, Collective.REDUCE, Collective.P2P):
            return 1.0
        return (n - 1) / n


_OP_KINDS = {
    Collective.ALL_REDUCE: OpKind.ALL_REDUCE, Collective.ALL_GATHER: OpKind.ALL_GATHER,
    Collective.REDUCE_SCATTER: OpKind.REDUCE_SCATTER, Collective.ALL_TO_ALL: OpKind.ALL_TO_ALL,
    Collective.BROADCAST: OpKind.BROADCAST, Collective.REDUCE: OpKind.REDUCE,
    Collective.P2P: OpKind.SEND_F,
}
_FROM_OP_KIND = {kind: coll for coll, kind in _OP_KINDS.items() if coll is not Collective.P2P}
_FROM_OP_KIND.update({OpKind.SEND_F: Collective.P2P, OpKind.SEND_B: Collective.P2P,
                      OpKind.RECV_F: Collective.P2P, OpKind.RECV_B: Collective.P2P})

ALGORITHMS: dict[str, Callable[..., list[Phase]]] = {
    "ring": algos.ring, "tree": algos.tree, "multi-ring": algos.multi_ring,
    "hierarchical": algos.hierarchical, "direct": algos.direct, "nvls": algos.nvls,
    "nvls-tree": algos.nvls_tree, "pat": algos.pat, "collnet-chain": algos.collnet_chain,
}
_BY_HOST = ("multi-ring", "hierarchical")  # these take the GPUs' hosts
NCCL_NAMES = {"ring": "ring", "multi-ring": "ring", "tree": "tree", "nvls": "nvls",
              "nvls-tree": "nvls-tree", "pat": "pat", "collnet-chain": "collnet-chain"}
"""Which NCCL algorithm each of ours is (sim.nccl_collectives runs them, with a
protocol, where NCCL's model applies); hierarchical and direct are not NCCL's."""
NCCL_ONLY = ("nvls", "nvls-tree", "pat", "collnet-chain")  # need NCCL's model: CUDA GPUs
APPLICABLE = {
    Collective.ALL_REDUCE: ("ring", "tree", "multi-ring", "hierarchical", "nvls", "nvls-tree",
                            "collnet-chain"),
    Collective.ALL_GATHER: ("ring", "multi-ring", "hierarchical", "nvls", "pat"),
    Collective.REDUCE_SCATTER: ("ring", "multi-ring", "hierarchical", "nvls", "pat"),
    Collective.BROADCAST: ("ring", "tree"),
    Collective.REDUCE: ("ring",),
    Collective.ALL_TO_ALL: ("direct",),
    Collective.P2P: ("direct",),
}
AUTOMATIC = {coll: tuple(a for a in names if a not in NCCL_ONLY)
             for coll, names in {**APPLICABLE, Collective.BROADCAST: ("ring",)}.items()}
"""What the alpha-beta choice considers where NCCL's model does not apply (GPUs without a
CUDA compute capability): NCCL runs broadcast and reduce as rings only (its
src/device/broadcast.h and reduce.h specialise RunWorkColl for NCCL_ALGO_RING alone), so
their tree is a what-if that `algorithm='tree'` may force; NVLS needs CUDA."""


def parse_collective(op: str | Collective | OpKind | Op) -> Collective:
    """The collective `op` names: 'all-reduce', 'allreduce', 'all_reduce', 'ALL_REDUCE',
    an OpKind or an Op; raises ConfigError listing the known ones."""
    if isinstance(op, Collective):
        return op
    if isinstance(op, Op):
        op = op.kind
    if isinstance(op, OpKind) and op in _FROM_OP_KIND:
        return _FROM_OP_KIND[op]
    key = str(op.value if isinstance(op, Enum) else op).strip().lower()
    key = key.replace("_", "").replace("-", "").replace(" ", "")
    for coll in Collective:
        if coll.value.replace("-", "") == key or (coll is Collective.P2P and key == "sendrecv"):
            return coll
    raise ConfigError(f"collective op must be one of {', '.join(c.value for c in Collective)}"
                      f" (also spelled allreduce, all_reduce, ...), got {str(op)!r}")


def _check_algorithm(coll: Collective, algorithm: str) -> str:
    name = str(algorithm).strip().lower()
    if name not in ALGORITHMS:
        raise ConfigError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    if name not in APPLICABLE[coll]:
        raise ConfigError(f"algorithm={name!r} does not apply to {coll.value}: it runs "
                          f"{' or '.join(APPLICABLE[coll])}")
    return name


def _phases(coll: Collective, name: str, gpus: Sequence[str], nbytes: float,
            graph: nx.DiGraph) -> list[Phase]:
    if name in _BY_HOST:
        host_of = {gpu: graph.nodes[gpu]["host"] for gpu in gpus}
        return ALGORITHMS[name](coll.value, gpus, nbytes, host_of)
    return ALGORITHMS[name](coll.value, gpus, nbytes)


def _split_protocol(algorithm: str | None, protocol: str | None
                    ) -> tuple[str | None, str | None]:
    """('ring', 'LL128') from 'ring/LL128' (a choice reported earlier) or the two given."""
    if algorithm is not None and "/" in str(algorithm):
        algorithm, named = str(algorithm).split("/", 1)
        protocol = protocol or named
    return algorithm, parse_protocol(protocol)


KEPT_FLOWS = 1 << 20
"""Flows of the phases `collective_phases` keeps per graph (a replay runs the same
collectives over and over); past it the kept ones are dropped, so a sweep of large
collectives does not hold them all."""
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> [flows, {key: hit}]


def collective_phases(op: str | Collective | OpKind | Op, gpus: Sequence[str], nbytes: float,
                      graph: nx.DiGraph, algorithm: str | None = None,
                      protocol: str | None = None) -> tuple[str, list[Phase]]:
    """(algorithm name, phases) of collective `op` of size `nbytes` over GPU nodes `gpus`
    (in ring order). On CUDA GPUs NCCL's algorithms run as NCCL chooses and runs them
    (sim.nccl_collectives; the name is then 'algorithm/protocol'), restricted to
    `algorithm` / `protocol` where given; elsewhere, and for hierarchical and direct,
    `algorithm=None` picks the fastest alpha-beta estimate (module docstring). A function
    of its arguments and the graph's links, so kept per graph object (up to KEPT_FLOWS
    flows; like sim.route_shares, it assumes links keep their bandwidths): callers read
    the phases, never change them."""
    coll = parse_collective(op)
    key = (coll, tuple(gpus), nbytes, algorithm, protocol)
    kept = _KEPT.setdefault(graph, [0, {}])
    hit = kept[1].get(key)
    if hit is None:
        hit = _collective_phases(coll, gpus, nbytes, graph, algorithm, protocol)
        flows = sum(len(phase.flows) for phase in hit[1])
        if flows <= KEPT_FLOWS:  # one too large to keep leaves the others kept
            if kept[0] + flows > KEPT_FLOWS:
                kept[:] = [0, {}]
            kept[0] += flows
            kept[1][key] = hit
    return hit


def _collective_phases(coll: Collective, gpus: Sequence[str], nbytes: float,
                       graph: nx.DiGraph, algorithm: str | None,
                       protocol: str | None) -> tuple[str, list[Phase]]:
    if nbytes < 0:
        raise ConfigError(f"nbytes must be >= 0, got {nbytes}")
    algorithm, protocol = _split_protocol(algorithm, protocol)
    name = None if algorithm is None else _check_algorithm(coll, algorithm)
    nccl = None if name is None else NCCL_NAMES.get(name)
    shape = (comm_shape(graph, gpus) if coll.value in TUNED and len(gpus) > 1
             and (name is None or nccl is not None) else None)
    if nccl is not None and not any(tuning.runs(coll.value, nccl, p) for p in tuning.PROTOCOLS):
        shape = None  # a what-if NCCL never runs (a broadcast tree): the alpha-beta path
    if shape is not None:
        return nccl_phases(coll.value, gpus, nbytes, graph, shape, nccl, protocol)
    if coll.value in SEND_RECV and len(gpus) > 1:
        p2p_shape = comm_shape(graph, gpus)
        if p2p_shape is not None:
            return p2p_phases(coll.value, gpus, nbytes, p2p_shape, protocol)
    if protocol is not None:
        raise ConfigError(f"protocol={protocol!r} applies to NCCL's algorithms (ring, tree, "
                          f"nvls, nvls-tree, pat, collnet-chain) on CUDA GPUs, not to "
                          f"{name or 'the choice'} for {coll.value} here")
    if name in NCCL_ONLY:
        raise ConfigError(f"algorithm={name!r} is NCCL's: it needs CUDA GPUs (NVLS: of SM90 "
                          f"or later on an NVSwitch)")
    if name is not None:
        return name, _phases(coll, name, gpus, nbytes, graph)
    candidates = []
    for name in AUTOMATIC[coll]:
        try:
            candidates.append((name, _phases(coll, name, gpus, nbytes, graph)))
        except ConfigError:
            continue  # not applicable to this group (e.g. hierarchical on one host)
    if len(candidates) == 1:
        return candidates[0]
    return _fastest(candidates, graph)


def _fastest(candidates: list[tuple[str, list[Phase]]], graph: nx.DiGraph
             ) -> tuple[str, list[Phase]]:
    """min(candidates, key=estimate_time), skipping the estimates that cannot win: each
    candidate's `estimate_lower_bound` is computed first (a sample of its flows), the
    candidates are estimated in order of their bounds, and one whose bound already
    exceeds the best estimate so far (or equals it, coming later in order, where ties
    go to the first) is never estimated. Exact: the bound never exceeds the estimate."""
    bounds = sorted((estimate_lower_bound(phases, graph), i) for i, (_, phases)
                    in enumerate(candidates))
    best = None
    for bound, i in bounds:
        if best is not None and (bound, i) > best:
            break  # this bound and the rest cannot beat `best` (sorted)
        best = min(best or (math.inf, i), (estimate_time(candidates[i][1], graph), i))
    return candidates[best[1]]


# --- running on the network --------------------------------------------------------------------
@dataclass
class CollectiveRun:
    """What one run of a collective did (the value of run_collective's event)."""

    collective: Collective
    algorithm: str
    nbytes: float
    steps: int  # route-latency steps paid; latency_s: NCCL's modelled latency (paid_latency)
    latency_s: float | None
    flows: int
    start: float
    end: float = 0.0
    spans: list[Span] = field(default_factory=list)

    @property
    def time_s(self) -> float:
        return self.end - self.start


def repeated(phases: Sequence[Phase], count: int) -> list[Phase]:
    """`count` back-to-back runs of `phases` as one: steps and bytes times count. Exact
    for the alpha-beta cost of an uncontended run; under contention the bytes share
    links as one longer collective would."""
    if count == 1:
        return list(phases)
    return [Phase(p.steps * count, [(a, b, n * count) for a, b, n in p.flows],
                  None if p.latency is None else p.latency * count) for p in phases]


def run_collective(env: simpy.Environment, network: FlowNetwork,
                   op: str | Collective | OpKind | Op, gpus: Sequence[str],
                   nbytes: float | None = None, algorithm: str | None = None, *,
                   protocol: str | None = None, lane: str | None = None,
                   ranks: Sequence[int] | None = None,
                   spans: list[Span] | None = None) -> simpy.Event:
    """Start collective `op` over `gpus` now; the returned event fires with a
    CollectiveRun when the last flow has arrived.

    `op` may be a schedule's Op (its `nbytes` and `group` then default the size and the
    lane, and the spans carry it), else the lane is 'coll'. `algorithm` / `protocol`
    force NCCL's choice (collective_phases). An Op with `count` k > 1 runs
    k back-to-back collectives of nbytes/k each (`repeated`). One Span per member, on rank
    `ranks[i]` (default: the GPU's global index), is appended to `spans` if given; its
    `info` holds algorithm, steps (and nccl_latency_us where NCCL's latency was paid:
    latency_info), bytes, algbw_GBps and busbw_GBps."""
    coll = parse_collective(op)
    schedule_op = op if isinstance(op, Op) else None
    size = float(schedule_op.nbytes if nbytes is None and schedule_op else nbytes or 0)
    count = schedule_op.count if schedule_op else 1
    name, phases = collective_phases(coll, gpus, size / count, network.graph, algorithm,
                                     protocol)
    phases = repeated(phases, count)
    record = CollectiveRun(coll, name, size, *paid_latency(phases),
                           sum(len(p.flows) for p in phases), env.now)
    done = env.event()
    lane = lane or (schedule_op.group if schedule_op and schedule_op.group else COLLECTIVE_LANE)
    ranks = list(ranks) if ranks is not None else [network.graph.nodes[g]["index"] for g in gpus]
    if len(ranks) != len(gpus):
        raise ConfigError(f"ranks: need one rank per GPU ({len(gpus)}), got {len(ranks)}")

    def finish() -> None:
        record.end = env.now
        record.spans = _member_spans(record, schedule_op, lane, ranks)
        if spans is not None:
            spans.extend(record.spans)
        done.succeed(record)

    _start_phase(network, phases, 0, finish)
    return done


def _start_phase(network: FlowNetwork, phases: Sequence[Phase], index: int,
                 finish: Callable[[], None]) -> None:
    """Start phase `index` of a collective's `phases`, the next one when it ends, and
    `finish()` after the last. A module function: a closure naming itself would be a
    reference cycle, kept with its phases until the run ends (sim.engine.when_processed)."""
    if index == len(phases):
        finish()
        return
    phase = phases[index]
    links = network.paths_links([(src, dst) for src, dst, _ in phase.flows])
    coflow = network.coflow(links, [nbytes for _, _, nbytes in phase.flows])
    alpha = network.longest_latency(coflow)
    network.start(coflow, delay=phase.wait(alpha)).callbacks.append(
        lambda _event: _start_phase(network, phases, index + 1, finish))


def latency_info(steps: int, latency_s: float | None) -> dict:
    """A span's or a result's latency keys: 'steps' (route latencies paid), and
    'nccl_latency_us' where NCCL's modelled latency was paid instead (paid_latency)."""
    return {"steps": steps} if latency_s is None else {
        "steps": steps, "nccl_latency_us": latency_s * 1e6}


def _member_spans(record: CollectiveRun, schedule_op: Op | None, lane: str,
                  ranks: Sequence[int]) -> list[Span]:
    n, t = len(ranks), record.time_s
    algbw = record.nbytes / t if t > 0 else 0.0
    info = {"collective": record.collective.value, "algorithm": record.algorithm,
            **latency_info(record.steps, record.latency_s), "bytes": record.nbytes,
            "algbw_GBps": algbw / 1e9,
            "busbw_GBps": algbw * record.collective.busbw_factor(n) / 1e9}
    op = schedule_op or Op(_OP_KINDS[record.collective], 0, group=lane,
                           nbytes=int(record.nbytes))
    ops = [op] * n
    if record.collective is Collective.P2P and schedule_op is None:
        ops = [op, Op(OpKind.RECV_F, 0, group=lane, nbytes=int(record.nbytes))]
    return [Span(rank, lane, o, record.start, record.end, info) for rank, o in zip(ranks, ops)]


# --- one collective on a topology, as nccl-tests measures it -----------------------------------
@dataclass
class CollectiveResult:
    """One simulated collective: time (s), algbw and busbw (bytes/s), the algorithm and
    the latency it paid (route-latency steps, or NCCL's modelled latency: paid_latency),
    the per-member Timeline and the number of flows simulated."""

    collective: Collective
    nbytes: float
    ranks: int
    time_s: float
    algbw: float
    busbw: float
    algorithm: str
    steps: int
    timeline: Timeline
    flows: int
    latency_s: float | None = None  # NCCL's modelled latency, where paid (paid_latency)

    def to_dict(self) -> dict:
        return {"op": self.collective.value, "size_bytes": self.nbytes, "ranks": self.ranks,
                "algorithm": self.algorithm, **latency_info(self.steps, self.latency_s),
                "time_s": self.time_s,
                "time_us": self.time_s * 1e6, "algbw_GBps": self.algbw / 1e9,
                "busbw_GBps": self.busbw / 1e9, "flows": self.flows}


def simulate_collective(op: str | Collective | OpKind, nbytes: float, ranks: int,
                        topology: str | nx.DiGraph, algorithm: str | None = None,
                        protocol: str | None = None) -> CollectiveResult:
    """Simulate `op` of `nbytes` (nccl-tests convention) over the first `ranks` GPUs of
    `topology` (a preset name, a topology file or a graph), ring order = GPU index."""
    return sweep_collective(op, [nbytes], ranks, topology, algorithm, protocol)[0]


def sweep_collective(op: str | Collective | OpKind, sizes: Sequence[float], ranks: int,
                     topology: str | nx.DiGraph, algorithm: str | None = None,
                     protocol: str | None = None) -> list[CollectiveResult]:
    """simulate_collective for each size, one after another on one network (so routes
    are found once; each collective runs alone, its spans start where the last ended)."""
    coll = parse_collective(op)
    graph = load_topology(topology) if isinstance(topology, str) else topology
    gpus = gpu_nodes(graph)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ConfigError(f"ranks must be an integer >= 2 (a collective over one rank moves "
                          f"no data), got {ranks!r}")
    if ranks > len(gpus):
        raise ConfigError(f"ranks={ranks} exceeds the {len(gpus)} GPUs of topology "
                          f"{graph.graph.get('name', '?')!r}")
    if coll is Collective.P2P and ranks != 2:
        raise ConfigError(f"ranks must be 2 for p2p (sender, receiver), got {ranks}")
    for nbytes in sizes:
        if not nbytes > 0:
            raise ConfigError(f"size must be a positive number of bytes, got {nbytes!r}")
    env = simpy.Environment()
    network = FlowNetwork(env, graph)
    results = []
    for nbytes in sizes:
        done = run_collective(env, network, coll, gpus[:ranks], nbytes, algorithm,
                              protocol=protocol)
        env.run()
        run: CollectiveRun = done.value
        t = run.time_s
        algbw = nbytes / t if t > 0 else float("inf")
        meta = {"collective": coll.value, "algorithm": run.algorithm,
                "topology": graph.graph.get("name"), "ranks": ranks, "nbytes": nbytes}
        results.append(CollectiveResult(
            coll, nbytes, ranks, t, algbw, algbw * coll.busbw_factor(ranks), run.algorithm,
            run.steps, Timeline(run.spans, source="sim", meta=meta), run.flows,
            run.latency_s))
    return results
