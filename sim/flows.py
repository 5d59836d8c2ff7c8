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

Bookkeeping: flows started together (a collective phase's, or one transfer) are one
`FlowBatch`, their routes and bytes held in numpy arrays (a 1,024-GPU all-to-all phase has
a million flows: one object, not a million). Each link knows the batches with live flows
on it; a change re-rates only the *component* of batches linked to it through shared links
(pipeline P2P transfers rarely share links, so most changes touch one flow), a batch
whole: its flows that share no link with the change form components of their own, whose
max-min rates are the same (sim.maxmin: up to its 1e-9 level tolerance). Each batch sits
in one heap at its earliest flow finish; one SimPy timer fires at the earliest and ends
every flow due then, so a collective's flows that end together cost one event.
"""
from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence

import networkx as nx
import numpy as np
import simpy

from .ecmp import EcmpRoutes, _PairRoutes
from .flow_batch import Ended, FlowBatch, OneFlow, flow_batch
from .link_capacity import achievable_capacities
from .maxmin import max_min_entries

__all__ = ["FlowNetwork", "_PairRoutes"]  # _PairRoutes: tests/test_flows.py

Batch = FlowBatch | OneFlow

class FlowNetwork:
    """The transfer seam with contention: max-min fair flows on the topology's links."""

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph, ecmp: bool = True):
        self.env, self.graph, self.ecmp = env, graph, ecmp
        self.link_index = {edge: i for i, edge in enumerate(graph.edges)}
        # achievable bytes/s of each link, same order (sim.link_capacity)
        self._capacity_array = achievable_capacities(graph)  # for max_min_entries
        self.capacity = self._capacity_array.tolist()
        self.latency = [lat for _, _, lat in graph.edges(data="latency")]
        self._latency_array = np.asarray(self.latency, dtype=float)
        self.flows_on: dict[int, set[Batch]] = defaultdict(set)  # batches with live flows
        self._ecmp = EcmpRoutes(graph, self.link_index, ecmp)
        self._heap: list[tuple[float, int, int, Batch]] = []
        self._order = itertools.count()
        self._timer_generation = 0
        self._timer_at = float("inf")
        self.completed_flows = 0
        # a list while someone records the flows started (sim.shared_links: whose they
        # are): (time they join, after the delay; their FlowBatch)
        self.flow_log: list[tuple[float, Batch]] | None = None

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

    def start_flows(self, flows: Sequence[tuple[Sequence[int], float]],
                    delay: float = 0.0) -> simpy.Event:
        """Start several flows ((link ids, bytes) each) together after `delay` seconds;
        the returned event fires when all of them have delivered their bytes."""
        return self.start(self.batch(flows), delay)

    def batch(self, flows: Sequence[tuple[Sequence[int], float]]) -> Batch:
        """Flows ((link ids, bytes) each) to `start` together (sim.flow_batch)."""
        return flow_batch(flows, self.env.event(), len(self.capacity))

    def start(self, batch: Batch, delay: float = 0.0) -> simpy.Event:
        """Start `batch` after `delay` seconds; its event (fired when every flow has
        delivered its bytes)."""
        if self.flow_log is not None:
            self.flow_log.append((self.env.now + delay, batch))
        if not batch.size:
            batch.done.succeed()
        elif delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _e: self._add(batch))
        else:
            self._add(batch)
        return batch.done

    def longest_latency(self, batch: Batch) -> float:
        """The largest route latency (s, sum of per-hop latencies) of `batch`'s flows."""
        return batch.longest_route(self._latency_array)

    # --- rates -----------------------------------------------------------------------------
    def _add(self, batch: Batch) -> None:
        now = batch.last = self.env.now
        flows_on = self.flows_on
        for link in batch.on_links:
            flows_on[link].add(batch)
        self._release(batch, batch.end_empty(now))  # nothing to send, or no link: delivered
        if batch.left:
            self._rerate(set(batch.on_links))

    def _release(self, batch: Batch, ended: Ended) -> None:
        """Flows of `batch` have ended: their links are released (ECMP's counts, the
        batch's place on the links it left) and the batch counts them (_finished)."""
        if not ended.count:
            return
        self._ecmp.release_counts(ended.links, ended.counts)
        flows_on = self.flows_on
        for link in ended.vacated:
            flows_on[link].discard(batch)
        self.completed_flows += ended.count
        if not batch.left:
            self._finished(batch)

    def _finished(self, batch: FlowBatch) -> None:
        """The last flow of `batch` has delivered its bytes. A lone flow's event is
        succeeded at once; a larger batch's by a relay event scheduled now, as the old
        design's last per-flow event with its countdown callback was, so that SimPy
        processes events in the same order."""
        if batch.size == 1:
            batch.done.succeed()
            return
        relay = self.env.event()
        relay.callbacks.append(lambda _event: batch.done.succeed())
        relay.succeed()

    def _component(self, seed_links: set[int]) -> list[Batch]:
        """Batches connected to `seed_links` through shared links (breadth-first, a layer
        of links and then of batches at a time, so the set operations run in C)."""
        flows_on = self.flows_on
        seen_links = set(seed_links)
        batches = set().union(*[flows_on[l] for l in seed_links])
        frontier = batches
        while frontier:
            links = set().union(*[b.on_links.keys() for b in frontier]) - seen_links
            if not links:
                break
            seen_links |= links
            frontier = set().union(*[flows_on[l] for l in links]) - batches
            batches |= frontier
        return list(batches)

    def _rerate(self, seed_links: set[int]) -> None:
        batches = self._component(seed_links)
        if not batches:  # the freed links carry nothing else: other flows' finishes still pend
            self._arm_timer()
            return
        now, heap, order = self.env.now, self._heap, self._order
        if len(batches) == 1 and batches[0].left == 1:
            batches[0].set_rates(batches[0].lone_rate(self.capacity), now)
        else:
            offsets = np.cumsum([0] + [b.size for b in batches]).tolist()
            entries = [b.entries() for b in batches]
            flow_of = np.concatenate([f + o for (f, _), o in zip(entries, offsets)])
            ids = np.concatenate([i for _, i in entries])
            rates = max_min_entries(flow_of, ids, offsets[-1], self._capacity_array)
            for batch, start in zip(batches, offsets):
                batch.set_rates(rates[start:start + batch.size], now)
        for batch in batches:
            heapq.heappush(heap, (batch.next_finish(), next(order), batch.version, batch))
        self._arm_timer()

    def _arm_timer(self) -> None:
        while self._heap and self._heap[0][2] != self._heap[0][3].version:
            heapq.heappop(self._heap)  # stale entry: the batch was re-rated since
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
        now = self.env.now
        due = now * (1 + 1e-12) + 1e-15
        heap, freed, waiting = self._heap, set(), []
        while heap and (heap[0][0] <= due or heap[0][2] != heap[0][3].version):
            _, _, version, batch = heapq.heappop(heap)
            if version != batch.version:
                continue
            ended = batch.end_due(due, now)
            freed.update(ended.links)
            self._release(batch, ended)
            if batch.left:
                waiting.append(batch)
        for batch in waiting:  # its other flows' finishes (stale once it is re-rated)
            heapq.heappush(heap, (batch.next_finish(), next(self._order), batch.version,
                                  batch))
        if freed:
            self._rerate(freed)
        else:
            self._arm_timer()

    # --- observation (tests, reports) --------------------------------------------------------
    def link_load(self) -> dict[int, float]:
        """Current total rate (bytes/s) on every link that carries a flow."""
        load: dict[int, float] = defaultdict(float)
        for batch in set().union(*self.flows_on.values()):
            for link, rate in batch.live_link_rates():
                load[link] += rate
        return dict(load)

    def rates_on(self, link: int) -> list[float]:
        """The current rates (bytes/s) of the live flows crossing `link`."""
        return [rate for batch in self.flows_on.get(link, ())
                for on, rate in batch.live_link_rates() if on == link]
