"""A lower bound of the iteration time the replay (sim.simulate) returns, without
replaying: the planner's test of whether a layout can still beat the best one simulated.

Per stage s and compute kind k (F, B, or I and W), two numbers from the simulator's own
cost model:
- c(k, s): the op's compute seconds, the cost model's compute time of the op
  (sim.cost_model: per-kernel rooflines; the F and B of a stage, I and W half the
  backward's kernels each, sim.cost.StageKernelCost);
- x(k, s): the seconds of its blocking intra-layer collectives (schedules.intra_layer:
  those of a group not in ParallelConfig.overlapped_groups; expert ones only outside
  DualPipe's overlapped pairs) whose group sits on one host, which the replay charges
  as their uncontended alpha-beta time (sim.collective_model, `cached`): `safe_time`
  (below, never above it) of the same algorithm choice, times their count. A collective
  of a group spanning hosts counts 0.
Why a lower bound: a rank's compute ops run one at a time in program order, and a
blocking collective starts after the compute op before it and holds back the next one
(schedules.contract), so a rank is busy at least sum(c + x) over its program; an op
waits for its producers (F(s-1, m) before F(s, m); F(s, m) and the backward of s+1
before the backward of s; I before W), and transfers, data-parallel collectives, the
optimizer step, contention and the slowdown of compute beside collectives only add
time. With a fixed order on each rank, start times are max-plus expressions of the
durations, so the compute-only schedule with these durations finishes no later than the
replay.
- `quick_bound` (closed form, O(stages)): max over pipeline ranks r of
  head(r) + busy(r) + tail(r), head(r) = the forwards c(F, s') of the stages before r's
  first stage (microbatch 0 reaches it no earlier), busy(r) = M * sum over r's stages of
  (c + x), tail(r) = the backwards c(B, s') of the stages before r's first stage (its last
  backward still has to run down the chain; 0 for schedules with a split backward, whose
  last op may be a W). For 1F1B and interleaved 1F1B this is the schedule's closed form
  M*v*(f+b) + (p-1)*(f+b) per chunk without communication.
- `path_bound`: the exact finish time of the compute-only schedule with these
  durations (the contract's compute rules; producers' compute ends, collectives after
  the consumer's own ops), O(ops).

Collective seconds (`safe_time`, `CollectiveTimes`): what the lowered-schedule bounds
(`lane_bound`, sim.planner.walk) charge a collective or a P2P transfer, a lower bound of
the flow network's time for it (sim.collectives.run_collective, sim.flows). The flow
network runs each phase of the algorithm the replay picks (collective_phases, as here)
as: a wait of steps x the largest latency of the routes its flows took, then every flow
on ONE fewest-hop route (adaptive ECMP), max-min fair, so no link carries more than its
bandwidth; the phase ends with its last flow. So a phase lasts at least steps x L + max
over links of (bytes that must cross the link) / bandwidth, where L bounds every route's
latency from below (the latencies of the links on all of the pair's routes, plus the
lowest link latency for each other hop) and a flow's bytes must cross the links on all of
its pair's routes (share 1 in sim.route_shares). estimate_time itself is not provably
below the flows: it charges the LARGEST route latency and splits each flow's bytes evenly
over its routes, which can load a link more than a one-route choice does. On the presets
(uniform link latencies; every bottleneck a link all routes share: a GPU's NVLink, its
NIC's PCIe and rail) the two are equal (checked for ring, tree and hierarchical
collectives of 2-256 GPUs on selene-a100 and dgx-a100), but for ROUNDING (1e-9
relative, against float rounding). A P2P transfer (sim.flows:
latency, then one flow) lasts at least L + bytes / the slowest link all its routes share.
An intra-node intra-layer collective the replay charges estimate_time (`cached`), which
these never exceed. `flows=False` (a cost model whose network or collectives are not the
flow network's: UniformCostModel's free ones, a profile's) charges 0.
Units: seconds.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import networkx as nx
import numpy as np

from clustersim.schedules.intra_layer import covered, op_comms
from clustersim.schedules.ep_comms import pair_hides_experts
from clustersim.schedules.names import EP, ETP, INTRA_LAYER_GROUPS
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.plan import Plan
from clustersim.schedules.schedule import Schedule

from ..collective_algorithms import Phase, estimate_time
from ..collectives import collective_phases
from ..cost_model import CostModel, RooflineCostModel
from ..route_shares import RouteShares, route_shares

SPLIT_KINDS = (OpKind.F, OpKind.I, OpKind.W)
FUSED_KINDS = (OpKind.F, OpKind.B)
KIND_NAMES = {OpKind.F: "F", OpKind.B: "B", OpKind.I: "I", OpKind.W: "W"}


@dataclass(frozen=True)
class StageTimes:
    """c(k, s) and x(k, s) of the module docstring: `compute[kind][s]`, `comm[kind][s]`
    (seconds), for the kinds of a fused (F, B) or split (F, I, W) backward."""

    compute: dict[OpKind, list[float]]
    comm: dict[OpKind, list[float]]

    def busy(self, kind: OpKind, stage: int) -> float:
        return self.compute[kind][stage] + self.comm[kind][stage]


def stage_times(plan: Plan, topology: nx.DiGraph, costs: CostModel,
                split: bool) -> StageTimes:
    """c and x of every stage of `plan` (module docstring)."""
    seconds = costs.compute_time(plan, topology)
    kinds = (*SPLIT_KINDS, OpKind.B) if split else FUSED_KINDS
    compute = {k: [seconds(Op(k, s, 0)) for s in range(plan.num_stages)] for k in kinds}
    memo: dict[tuple, float] = {}
    flows = isinstance(costs, RooflineCostModel)  # others may price collectives otherwise
    comm = {k: [_blocking_comm(plan, topology, k, s, memo) if flows else 0.0
                for s in range(plan.num_stages)] for k in kinds}
    return StageTimes(compute, comm)


def _blocking_comm(plan: Plan, topology: nx.DiGraph, kind: OpKind, stage: int,
                   memo: dict[tuple, float]) -> float:
    """x(kind, stage): seconds of the blocking intra-layer collectives on one host;
    `memo`: one collective's seconds by (kind, bytes, GPUs)."""
    parallel = plan.parallel
    overlapped = set(parallel.overlapped_groups)
    if pair_hides_experts(plan.model, parallel):
        overlapped |= {EP, ETP}  # beside DualPipe's pairs (a schedule may have none: safe)
    rank = plan.replayed_ranks[plan.stage_ranks[stage]]
    total = 0.0
    for comm in op_comms(plan, covered(Op(kind, stage, 0), plan, 1)):
        if comm.group in overlapped or comm.group not in INTRA_LAYER_GROUPS:
            continue
        ranks = plan.group(comm.group, rank)
        if plan.cluster.spans_hosts(ranks):
            continue
        total += comm.count * _one_collective(comm.kind, comm.nbytes / comm.count,
                                              plan, ranks, topology, memo)
    return total


def _one_collective(kind: OpKind, nbytes: float, plan: Plan, ranks: list[int],
                    topology: nx.DiGraph, memo: dict[tuple, float]) -> float:
    """A lower bound of the seconds of one `kind` collective of `nbytes` (nccl-tests
    size) over the GPUs of global `ranks`, with the algorithm the simulator would pick
    (sim.collectives): `safe_time` of its phases, memoised by (kind, bytes, GPUs)."""
    gpus = tuple(plan.cluster.gpus[g] for g in ranks)
    key = (kind, nbytes, gpus)
    if key not in memo:
        memo[key] = safe_time(collective_phases(kind, gpus, nbytes, topology)[1], topology)
    return memo[key]


_MANDATORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
ROUNDING = 1 - 1e-9
"""Every safe time is scaled by it, so that float rounding in these sums (in another
order than the flow network's) cannot lift one above the replay."""


def safe_time(phases: list[Phase], graph: nx.DiGraph) -> float:
    """A lower bound of the seconds the flow network (sim.collectives.run_collective)
    takes for `phases`, never above sim.collective_algorithms.estimate_time (module
    docstring, "Collective seconds")."""
    per_pair = _mandatory_of(route_shares(graph))[0]
    return estimate_time(phases, graph, per_pair) * ROUNDING


def _mandatory_of(shares: RouteShares):
    """(pair -> (route latency bound, the pair's links on every route, their shares: 1
    as sim.route_shares rounds it), the lowest link latency) for the routes of `shares`,
    cached per RouteShares."""
    hit = _MANDATORY.get(shares)
    if hit is None:
        latency = np.fromiter((lat for _, _, lat in shares.graph.edges(data="latency")),
                              dtype=float, count=len(shares.edge_id))
        lowest = float(latency.min()) if len(latency) else 0.0
        cache: dict[tuple, tuple] = {}

        def per_pair(src, dst) -> tuple[float, np.ndarray, np.ndarray]:
            found = cache.get((src, dst))
            if found is None:
                _, ids, part = shares.of(src, dst)
                on_all = part >= 1 - 1e-9  # cumsum of N times 1/N: 1 up to rounding
                hops = int(round(float(part.sum())))  # every route: the fewest hops
                must = ids[on_all]
                bound = float(latency[must].sum()) + max(0, hops - len(must)) * lowest
                found = cache[(src, dst)] = (bound, must, part[on_all])
            return found

        hit = _MANDATORY[shares] = (per_pair, lowest)
    return hit


def is_split(schedule: Schedule) -> bool:
    """Whether the schedule splits its backward into I and W."""
    return any(op.kind is OpKind.W for op in schedule.programs[0])


def quick_bound(plan: Plan, times: StageTimes, split: bool) -> float:
    """The closed-form bound of the module docstring."""
    m = plan.num_microbatches
    backward = (OpKind.I, OpKind.W) if split else (OpKind.B,)
    kinds = (OpKind.F, *backward)
    best = 0.0
    for r in range(plan.pp):
        stages = plan.stages_of(r)
        first = min(stages)
        head = sum(times.compute[OpKind.F][:first])
        tail = 0.0 if split else sum(times.compute[OpKind.B][:first])
        busy = m * sum(times.busy(k, s) for s in stages for k in kinds)
        best = max(best, head + busy + tail)
    return best


def path_bound(schedule: Schedule, times: StageTimes) -> float:
    """The finish time of the compute-only `schedule` with durations c + x (module
    docstring): each rank runs its ops in order, each op when its producers' compute has
    ended; its collectives hold the rank after it."""
    last = schedule.num_stages - 1
    done: dict[tuple, float] = {}
    f, b, i, w = OpKind.F, OpKind.B, OpKind.I, OpKind.W

    def ready(op: Op) -> float | None:
        s, m = op.stage, op.microbatch
        if op.kind is f:
            return 0.0 if s == 0 else done.get((f, s - 1, m))
        if op.kind is w:
            return done.get((i, s, m))
        own = done.get((f, s, m))
        if s == last or own is None:
            return own
        down = done.get((b, s + 1, m), done.get((i, s + 1, m)))
        return None if down is None else max(own, down)

    programs = schedule.programs
    position, free = [0] * len(programs), [0.0] * len(programs)
    moved = True
    while moved:
        moved = False
        for r, program in enumerate(programs):
            k, t = position[r], free[r]
            while k < len(program):
                op = program[k]
                at = ready(op)
                if at is None:
                    break
                end = max(t, at) + times.compute[op.kind][op.stage]
                done[(op.kind, op.stage, op.microbatch)] = end
                t = end + times.comm[op.kind][op.stage]
                k += 1
            if k != position[r]:
                position[r], free[r], moved = k, t, True
    if any(k < len(p) for k, p in zip(position, programs)):
        return 0.0  # not every op could run (no registered schedule does this): no bound
    return max(free)


class CollectiveTimes:
    """Lower bounds of lowered collectives' seconds: `seconds(op, rank)` is op.count times
    the safe time of one (`_one_collective`, module docstring), 0 for a group of one GPU
    or without `flows`; memoised by (kind, bytes, count, group, global rank) as a
    schedule repeats them."""

    def __init__(self, plan: Plan, topology: nx.DiGraph, flows: bool = True):
        self.plan, self.topology, self.flows = plan, topology, flows
        self.memo: dict[tuple, float] = {}
        self.by_op: dict[tuple, float] = {}

    def seconds(self, op: Op, rank: int) -> float:
        key = (op.kind, op.nbytes, op.count, op.group, rank)
        found = self.by_op.get(key)
        if found is None:
            ranks = self.plan.group(op.group, rank)
            found = 0.0 if (not self.flows or len(ranks) < 2 or op.count < 1
                            or op.nbytes <= 0) else (
                op.count * _one_collective(op.kind, op.nbytes / op.count, self.plan, ranks,
                                           self.topology, self.memo))
            self.by_op[key] = found
        return found

    def transfer(self, src: str, dst: str, nbytes: float) -> float:
        """A lower bound of the seconds a P2P transfer of `nbytes` from GPU node `src` to
        `dst` takes on the flow network (module docstring, "Collective seconds"); 0 with
        `flows` False or on one GPU."""
        if not self.flows or src == dst or nbytes <= 0:
            return 0.0
        key = (src, dst, nbytes)
        found = self.by_op.get(key)
        if found is None:
            shares = route_shares(self.topology)
            latency, links, _ = _mandatory_of(shares)[0](src, dst)
            slowest = float(shares.bandwidth[links].min()) if len(links) else float("inf")
            found = self.by_op[key] = (latency + nbytes / slowest) * ROUNDING
        return found


def lane_bound(lowered: Schedule, plan: Plan, topology: nx.DiGraph,
               collectives: CollectiveTimes | None = None) -> float:
    """The busiest collective lane of a lowered schedule: a rank's collectives of one
    group axis run one at a time, in issue order (schedules.contract, as NCCL runs one
    communicator), so the iteration lasts at least the sum of their times; each at least
    its count times `safe_time` of one (`CollectiveTimes`, module docstring). Plan: the
    full plan (schedules.plan.resolve) the schedule was lowered with."""
    collectives = collectives or CollectiveTimes(plan, topology)
    busiest = 0.0
    for r, program in enumerate(lowered.programs):
        rank = plan.replayed_ranks[r]
        lanes: dict[str, float] = {}
        for op in program:
            if op.kind.is_collective:
                lanes[op.group] = lanes.get(op.group, 0.0) + collectives.seconds(op, rank)
        busiest = max([busiest, *lanes.values()])
    return busiest
