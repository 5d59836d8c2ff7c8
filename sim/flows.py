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
`Coflow` (sim.flow_batch), whose event fires when its last flow ends; a large one keeps
its flows in one `FlowBatch` of numpy arrays (a 1,024-GPU all-to-all phase has a million
flows: one object, not a million), a small one a `OneFlow` each. Each link knows the parts
with live flows on it; a change re-rates only the *component* of parts linked to it
through shared links (pipeline P2P transfers rarely share links, so most changes touch
one flow), a FlowBatch whole: its flows that share no link with the change form
components of their own, whose max-min rates are the same (sim.maxmin: up to its 1e-9
level tolerance). Each part sits in one heap at its earliest flow finish; one SimPy timer
fires at the earliest and ends every flow due then, so a collective's flows that end
together cost one event.
"""
from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from operator import attrgetter

import networkx as nx
import numpy as np
import simpy

from .ecmp import EcmpRoutes, _PairRoutes
from .flow_batch import Coflow, Countdown, Ended, Entries, FlowBatch, OneFlow
from .link_capacity import achievable_capacities
from .maxmin import max_min_entries

__all__ = ["FlowNetwork", "_PairRoutes"]  # _PairRoutes: tests/test_flows.py

Part = FlowBatch | OneFlow
_seq = attrgetter("seq")

class FlowNetwork:
    """The transfer seam with contention: max-min fair flows on the topology's links."""

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph, ecmp: bool = True):
        self.env, self.graph, self.ecmp = env, graph, ecmp
        # a link's id: its place in graph.edges' order (the adjacency dicts' order)
        edges = [(u, v, link["latency"]) for u, nbrs in graph._succ.items()
                 for v, link in nbrs.items()]
        self.link_index = {(u, v): i for i, (u, v, _) in enumerate(edges)}
        # achievable bytes/s of each link, same order (sim.link_capacity)
        self._capacity_array = achievable_capacities(graph)  # for max_min_entries
        self.capacity = self._capacity_array.tolist()
        self.latency = [lat for _, _, lat in edges]
        self._latency_array = np.asarray(self.latency, dtype=float)
        self.flows_on: dict[int, set[Part]] = defaultdict(set)  # parts with live flows
        self._ecmp = EcmpRoutes(graph, self.link_index, ecmp)
        self._heap: list[tuple[float, int, int, Part]] = []
        self._order = itertools.count()
        self._started = itertools.count()  # a part's `seq`: the order parts were added
        self._timer_generation = 0
        self._timer_at = float("inf")
        self.completed_flows = 0
        # a list while someone records the flows started (sim.shared_links: whose they
        # are): (time they join, after the delay; their Coflow)
        self.flow_log: list[tuple[float, Part]] | None = None

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
        return self.start(self.coflow([links], [nbytes]), delay=self.route_latency(links))

    def start_flows(self, flows: Sequence[tuple[Sequence[int], float]],
                    delay: float = 0.0) -> simpy.Event:
        """Start several flows ((link ids, bytes) each) together after `delay` seconds;
        the returned event fires when all of them have delivered their bytes."""
        return self.start(self.coflow([links for links, _ in flows],
                                      [nbytes for _, nbytes in flows]), delay)

    def coflow(self, routes: Sequence[Sequence[int]], sizes: Sequence[float]) -> Coflow:
        """Flows (route i: link ids, sizes[i] bytes) to `start` together (sim.flow_batch)."""
        return Coflow(routes, sizes, self.env.event(), len(self.capacity))

    def start(self, coflow: Coflow, delay: float = 0.0) -> simpy.Event:
        """Start `coflow` after `delay` seconds; its event (fired when every flow has
        delivered its bytes)."""
        if self.flow_log is not None:
            self.flow_log.append((self.env.now + delay, coflow))
        if not coflow.size:
            coflow.done.succeed()
        elif delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _e: self._add(coflow))
        else:
            self._add(coflow)
        return coflow.done

    def longest_latency(self, coflow: Coflow) -> float:
        """The largest route latency (s, sum of per-hop latencies) of `coflow`'s flows."""
        return max((part.longest_route(self.latency, self._latency_array)
                    for part in coflow.parts), default=0.0)

    # --- rates -----------------------------------------------------------------------------
    def _add(self, coflow: Coflow) -> None:
        now, parts = self.env.now, coflow.parts
        if len(parts) == 1 and parts[0].size == 1:
            self._add_one(parts[0], now)
            return
        seeds = set()
        for part in parts:
            self._join(part, now)
            seeds.update(part.on_links)
        if seeds:
            self._rerate(seeds)

    def _add_one(self, part: OneFlow, now: float) -> None:
        """`_add` of a coflow of one flow (a pipeline P2P transfer). On links no other flow
        is on, its component is itself: `_rerate` would give it its lone rate, so it gets
        that here without the component search (the same operations, in the same order)."""
        alone = self._join(part, now)
        if not part.on_links:
            return
        if not alone:
            self._rerate(set(part.on_links))
            return
        part.set_rates(part.lone_rate(self.capacity), now)
        heapq.heappush(self._heap, (part.next_finish(), next(self._order), part.version, part))
        self._arm_timer()

    def _join(self, part: Part, now: float) -> bool:
        """`part`'s flows join their links now (those with nothing to send or no link are
        delivered at once); whether no other flow was on any of its links."""
        part.last, part.seq = now, next(self._started)
        flows_on, alone = self.flows_on, True
        for link in part.on_links:
            on = flows_on[link]
            if on:
                alone = False
            on.add(part)
        self._release(part, part.end_empty(now))
        return alone

    def _release(self, part: Part, ended: Ended) -> None:
        """Flows of `part` have ended: their links are released (ECMP's counts, the part's
        place on the links it left) and its coflow's countdown counts them (_finished)."""
        if not ended.count:
            return
        self._ecmp.release_counts(ended.links, ended.counts)
        flows_on = self.flows_on
        for link in ended.vacated:
            flows_on[link].discard(part)
        self.completed_flows += ended.count
        countdown = part.countdown
        countdown.left -= ended.count
        if not countdown.left:
            self._finished(countdown)

    def _finished(self, countdown: Countdown) -> None:
        """The last flow of a coflow has delivered its bytes. A lone flow's event is
        succeeded at once; a larger coflow's by a relay event scheduled now, as the old
        design's last per-flow event with its countdown callback was, so that SimPy
        processes events in the same order."""
        done = countdown.done
        if countdown.size == 1:
            done.succeed()
            return
        relay = self.env.event()
        relay.callbacks.append(lambda _event: done.succeed())
        relay.succeed()

    def _component(self, seed_links: set[int]) -> list[Part]:
        """Parts connected to `seed_links` through shared links (breadth-first, a layer
        of links and then of parts at a time, so the set operations run in C), in the
        order they were added: a set of parts iterates in the order of their memory
        addresses, which would let the layout of the heap order ties between flows that
        end at the same time (and the max-min solver's sums)."""
        flows_on = self.flows_on
        seen_links = set(seed_links)
        parts = set().union(*[flows_on[l] for l in seed_links])
        frontier = parts
        while frontier:
            links = set().union(*[b.on_links for b in frontier]) - seen_links
            if not links:
                break
            seen_links |= links
            frontier = set().union(*[flows_on[l] for l in links]) - parts
            parts |= frontier
        return sorted(parts, key=_seq) if len(parts) > 1 else list(parts)

    def _rerate(self, seed_links: set[int]) -> None:
        parts = self._component(seed_links)
        if not parts:  # the freed links carry nothing else: other flows' finishes still pend
            self._arm_timer()
            return
        now, heap, order = self.env.now, self._heap, self._order
        if len(parts) == 1 and parts[0].left == 1:
            parts[0].set_rates(parts[0].lone_rate(self.capacity), now)
        else:
            offsets = list(itertools.accumulate([b.size for b in parts], initial=0))
            entries = Entries()
            for part, offset in zip(parts, offsets):
                part.gather(offset, entries)
            rates = max_min_entries(*entries.arrays(), offsets[-1], self._capacity_array)
            listed = rates.tolist() if len(parts) > 1 else []  # a OneFlow's rate: a float
            for part, start in zip(parts, offsets):
                part.set_rates(listed[start] if part.size == 1
                               else rates[start:start + part.size], now)
        for part in parts:
            heapq.heappush(heap, (part.next_finish(), next(order), part.version, part))
        self._arm_timer()

    def _arm_timer(self) -> None:
        while self._heap and self._heap[0][2] != self._heap[0][3].version:
            heapq.heappop(self._heap)  # stale entry: the part was re-rated since
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
            _, _, version, part = heapq.heappop(heap)
            if version != part.version:
                continue
            ended = part.end_due(due, now)
            freed.update(ended.links)
            self._release(part, ended)
            if part.left:
                waiting.append(part)
        for part in waiting:  # its other flows' finishes (stale once it is re-rated)
            heapq.heappush(heap, (part.next_finish(), next(self._order), part.version,
                                  part))
        if freed:
            self._rerate(freed)
        else:
            self._arm_timer()

    # --- observation (tests, reports) --------------------------------------------------------
    def link_load(self) -> dict[int, float]:
        """Current total rate (bytes/s) on every link that carries a flow."""
        load: dict[int, float] = defaultdict(float)
        for part in set().union(*self.flows_on.values()):
            for link, rate in part.live_link_rates():
                load[link] += rate
        return dict(load)

    def rates_on(self, link: int) -> list[float]:
        """The current rates (bytes/s) of the live flows crossing `link`."""
        return [rate for part in self.flows_on.get(link, ())
                for on, rate in part.live_link_rates() if on == link]
