"""Flow-level network: every transfer is a flow on a route; flows sharing a link share
it max-min fairly; rates are recomputed whenever a flow starts or ends.

A transfer of n bytes from src to dst waits the route's latency (sum of per-hop
latencies, s), then joins as a flow whose rate (bytes/s) is set by max-min fairness
(sim.maxmin) among the flows it shares links with, each link at its achievable rate
(sim.link_capacity: NCCL's figures, not the line rate). No packets or chunks are simulated.

Routes: the fewest-hop paths of the topology graph; where several exist (fat-tree
spines, rails) each new flow takes the one whose links carry the fewest unfinished flows
(routed or running), ties in per-pair round-robin order: an adaptive-routing model,
deterministic. (Per-pair round-robin alone sent the first flow of every pair over the
first spine, so a non-blocking fat-tree behaved oversubscribed.) The choice is sim.ecmp's:
routes composed per switch pair and cached (topologies.route_sets), the load summed over
only the links that not all of the pair's routes share (a shared link adds the same
count to every route, so it cannot change the choice).

Bookkeeping: only the *component* of flows linked to a change through shared links is
re-rated (pipeline P2P flows rarely share links, so most changes touch one flow). Each
flow's finish time sits in one heap; one SimPy timer fires at the earliest and completes
every flow due then, so a collective's flows that end together cost one event (past a few
hundred, the due entries are taken by one scan and a sort, the order popping gives).
"""
from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import networkx as nx
import simpy

from .ecmp import EcmpRoutes, _PairRoutes
from .link_capacity import achievable_capacities
from .maxmin import max_min_rates

__all__ = ["Flow", "FlowNetwork", "_PairRoutes"]  # _PairRoutes: tests/test_flows.py

_EPS_BYTES = 1e-6  # remaining bytes below this count as delivered (float rounding)
_POPS_BEFORE_SCAN = 256  # due flows popped one by one before the rest are taken at once


class _Batch:
    """Flows started together (`start_flows`); `done` fires when `left` reaches 0. Its
    event sits where the old design's per-flow events put it: a lone flow's is the flow's
    own (succeeded as it finishes); a larger batch's is succeeded by a relay event
    scheduled as its last flow finishes, as that flow's own event with its countdown
    callback was, so SimPy processes events in the same order as before with one event
    per batch instead of one per flow (a 1,024-GPU all-to-all has a million flows)."""

    __slots__ = ("left", "size", "done")

    def __init__(self, size: int, done: simpy.Event):
        self.left = self.size = size
        self.done = done


@dataclass(eq=False, slots=True)
class Flow:
    """One flow: `remaining` bytes as of time `last`, moving at `rate` bytes/s."""

    links: tuple[int, ...]
    remaining: float
    batch: _Batch
    rate: float = 0.0
    last: float = 0.0
    version: int = 0
    nbytes: float = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = self.remaining

    def advance(self, now: float) -> None:
        self.remaining = max(self.remaining - self.rate * (now - self.last), 0.0)
        self.last = now


class FlowNetwork:
    """The transfer seam with contention: max-min fair flows on the topology's links."""

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph, ecmp: bool = True):
        self.env, self.graph, self.ecmp = env, graph, ecmp
        self.link_index = {edge: i for i, edge in enumerate(graph.edges)}
        # achievable bytes/s of each link, same order (sim.link_capacity)
        self._capacity_array = achievable_capacities(graph)  # for max_min_rates
        self.capacity = self._capacity_array.tolist()
        self.latency = [lat for _, _, lat in graph.edges(data="latency")]
        self.flows_on: dict[int, set[Flow]] = defaultdict(set)
        self._ecmp = EcmpRoutes(graph, self.link_index, ecmp)
        self._heap: list[tuple[float, int, int, Flow]] = []
        self._order = itertools.count()
        self._timer_generation = 0
        self._timer_at = float("inf")
        self.completed_flows = 0
        # a list while someone records the flows started (sim.shared_fabric: whose they
        # are): (time they join, after the delay; the Flows); a finished Flow's `last` is
        # when it finished
        self.flow_log: list[tuple[float, list[Flow]]] | None = None

    # --- routing -------------------------------------------------------------------------
    def path_links(self, src: str, dst: str) -> tuple[int, ...]:
        """Link ids of the route the next flow from src to dst takes (module docstring);
        the flow is counted on them until it finishes."""
        return self._ecmp.choose(src, dst)

    def paths_links(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[int, ...]]:
        """`[self.path_links(s, d) for s, d in pairs]`, the same routes, for a whole
        collective phase at once (sim.ecmp.EcmpRoutes.choose_many)."""
        return self._ecmp.choose_many(pairs)

    def route_latency(self, links: Iterable[int]) -> float:
        return sum(map(self.latency.__getitem__, links))  # in route order, from 0

    # --- the seam --------------------------------------------------------------------------
    def transfer(self, src: str, dst: str, nbytes: float) -> simpy.Event:
        """Event that fires when `nbytes` sent now from src have arrived at dst."""
        links = self.path_links(src, dst) if src != dst else ()
        return self.start_flows([(links, nbytes)], delay=self.route_latency(links))

    def start_flows(self, flows: Sequence[tuple[tuple[int, ...], float]],
                    delay: float = 0.0) -> simpy.Event:
        """Start several flows together after `delay` seconds; the returned event fires
        when all of them have delivered their bytes (a collective phase uses this)."""
        batch = _Batch(len(flows), self.env.event())
        pending = [Flow(links, float(nbytes), batch) for links, nbytes in flows]
        if self.flow_log is not None:
            self.flow_log.append((self.env.now + delay, pending))
        done = batch.done
        if not pending:
            done.succeed()
        elif delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _e: self._add(pending))
        else:
            self._add(pending)
        return done

    # --- rates -----------------------------------------------------------------------------
    def _add(self, flows: list[Flow]) -> None:
        now, live = self.env.now, []
        for flow in flows:
            flow.last = now
            if not flow.links or flow.remaining <= _EPS_BYTES:
                self._unroute(flow)
                self._finished(flow.batch)
                continue
            for link in flow.links:
                self.flows_on[link].add(flow)
            live.append(flow)
        if live:
            self._rerate({link for flow in live for link in flow.links})

    def _unroute(self, flow: Flow) -> None:
        self._ecmp.release(flow.links)

    def _finished(self, batch: _Batch) -> None:
        """One flow of `batch` has delivered its bytes (_Batch: the event order)."""
        batch.left -= 1
        if batch.left:
            return
        if batch.size == 1:
            batch.done.succeed()
            return
        relay = self.env.event()
        relay.callbacks.append(lambda _event: batch.done.succeed())
        relay.succeed()

    def _component(self, seed_links: set[int]) -> list[Flow]:
        """Flows connected to `seed_links` through shared links (breadth-first, a layer
        of links and then of flows at a time, so the set operations run in C)."""
        flows_on = self.flows_on
        seen_links = set(seed_links)
        flows = set().union(*[flows_on[l] for l in seed_links])
        frontier = flows
        while frontier:
            links = {l for flow in frontier for l in flow.links} - seen_links
            if not links:
                break
            seen_links |= links
            frontier = set().union(*[flows_on[l] for l in links]) - flows
            flows |= frontier
        return list(flows)

    def _rerate(self, seed_links: set[int]) -> None:
        flows = self._component(seed_links)
        if not flows:  # the freed links carry nothing else: other flows' finishes still pend
            self._arm_timer()
            return
        now = self.env.now
        if len(flows) == 1:
            rates = [float(min(self.capacity[l] for l in flows[0].links))]
        else:
            rates = max_min_rates([f.links for f in flows], self._capacity_array)
        order, heap = self._order, self._heap
        for flow, rate in zip(flows, rates if isinstance(rates, list) else rates.tolist()):
            left = flow.remaining - flow.rate * (now - flow.last)  # Flow.advance, inlined
            flow.remaining = max(left, 0.0)
            flow.last, flow.rate = now, rate
            flow.version += 1
            heapq.heappush(heap, (now + flow.remaining / rate, next(order), flow.version, flow))
        self._arm_timer()

    def _arm_timer(self) -> None:
        while self._heap and self._heap[0][2] != self._heap[0][3].version:
            heapq.heappop(self._heap)  # stale entry: the flow was re-rated since
        if not self._heap:
            return
        at = self._heap[0][0]
        if at >= self._timer_at:
            return
        self._timer_generation += 1
        generation, self._timer_at = self._timer_generation, at
        timer = self.env.timeout(max(at - self.env.now, 0.0))
        timer.callbacks.append(lambda _e: self._on_timer(generation))

    def _on_timer(self, generation: int) -> None:
        if generation != self._timer_generation:
            return
        self._timer_at = float("inf")
        now, finished = self.env.now, []
        due = now * (1 + 1e-12) + 1e-15
        heap, pops = self._heap, 0
        while heap and (heap[0][0] <= due or heap[0][2] != heap[0][3].version):
            _, _, version, flow = heapq.heappop(heap)
            if version == flow.version:
                finished.append(flow)
            pops += 1
            if pops == _POPS_BEFORE_SCAN and heap and heap[0][0] <= due:
                finished += self._take_due(due)
                break
        freed: set[int] = set()
        flows_on, release = self.flows_on, self._ecmp.release
        for flow in finished:
            flow.advance(now)
            flow.version += 1
            for link in flow.links:
                flows_on[link].discard(flow)
            release(flow.links)
            freed.update(flow.links)
            self._finished(flow.batch)
        self.completed_flows += len(finished)
        if freed:
            self._rerate(freed)
        else:
            self._arm_timer()

    def _take_due(self, due: float) -> list[Flow]:
        """The current flows of the heap's entries due by `due`, in the order popping them
        would give (entries are unique by (finish, order), so sorting them is that
        order), and the heap without them: one scan and a sort instead of a pop each,
        when a collective's many flows end at once."""
        heap = self._heap
        taken = [entry for entry in heap if entry[0] <= due]
        self._heap = [entry for entry in heap if entry[0] > due]
        heapq.heapify(self._heap)
        taken.sort()  # by (finish, order): unique, so the flows are never compared
        return [flow for _, _, version, flow in taken if version == flow.version]

    # --- observation (tests, reports) --------------------------------------------------------
    def link_load(self) -> dict[int, float]:
        """Current total rate (bytes/s) on every link that carries a flow."""
        return {link: sum(f.rate for f in flows)
                for link, flows in self.flows_on.items() if flows}
