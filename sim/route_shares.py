"""Per GPU pair, what the alpha-beta estimate (sim.collective_algorithms.estimate_time)
needs of its equal-cost routes: the largest route latency (s) and the share of the
pair's bytes each link carries when they are split evenly over the routes (ideal ECMP),
as arrays of link ids and shares, so a phase's link loads are one numpy bincount.

Exactness (the numbers are those of the per-route loops this replaces, bit for bit):
- a link's share was 1/N (N routes) added once per route through it, from 0.0; here the
  same repeated addition, as np.cumsum of N times 1/N, once per N (`_repeated`); the count of routes
  through a link of a composed pair (topologies.route_sets: prefixes x middles x
  suffixes, whose parts share no link) is its count in its part times the other parts'
  sizes, the count over the listed routes;
- a route's latency was the sum of its links' latencies in route order, from 0; here the
  same sums, in the same order, prefix then middle then suffix (the distinct sums after
  each part cached, so a middle of hundreds of paths is summed once per distinct start);
- a phase's load on a link was the sum of its flows' bytes x share in flow order, from
  0.0; `np.bincount` adds its weights in input order, here flow order.
Cached per pair (routes() is what made the estimate slow) for the life of the object,
which estimate_time keeps per graph object: a graph changed after an estimate keeps
its old routes, as before.
"""
from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Hashable, Sequence

import networkx as nx
import numpy as np

from clustersim.topologies.route_sets import route_sets

from .link_capacity import achievable_capacities

_BY_GRAPH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def route_shares(graph: nx.DiGraph) -> RouteShares:
    """The RouteShares of `graph` (one per graph object)."""
    hit = _BY_GRAPH.get(graph)
    if hit is None:
        hit = _BY_GRAPH[graph] = RouteShares(graph)
    return hit


class RouteShares:
    """`of(src, dst)`: (largest route latency, link ids, shares) of a GPU pair."""

    def __init__(self, graph: nx.DiGraph):
        self.graph, self.sets = graph, route_sets(graph)
        self.edge_id = {e: i for i, e in enumerate(graph.edges)}
        self.bandwidth = achievable_capacities(graph)  # bytes/s, sim.link_capacity
        self._pairs: dict[tuple, tuple[float, np.ndarray, np.ndarray]] = {}
        self._repeats: dict[int, np.ndarray] = {}
        self._parts: dict = {}  # a part (or a middle's id) -> (it, its link ids and counts)
        self._segments: dict = {}  # (part or id, routes) -> (it, its link ids and shares)
        self._latencies: dict = {}  # (sums so far, part or id) -> (it, sums after it)

    def of(self, src: Hashable, dst: Hashable) -> tuple[float, np.ndarray, np.ndarray]:
        hit = self._pairs.get((src, dst))
        if hit is None:
            parts = self.sets.compose_parts(src, dst)
            if parts is None:  # as one part: the listed routes themselves
                paths = tuple(map(tuple, self.sets.routes(src, dst)))
                parts = (paths, ((paths[0][-1],),), ((paths[0][-1],),))
            hit = self._pairs[(src, dst)] = self._shares(parts)
        return hit

    def phase_load(self, pairs: Sequence[tuple[float, np.ndarray, np.ndarray]],
                   nbytes: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
        """(bytes on each link, by id; whether a flow crosses it) of flows with these
        `pairs` (from `of`) carrying `nbytes` each; flows in order (module docstring)."""
        size = len(self.edge_id)
        if not pairs:
            return np.zeros(size), np.zeros(size, dtype=bool)
        ids = np.concatenate([p[1] for p in pairs])
        shares = np.concatenate([p[2] for p in pairs])
        counts = np.fromiter((len(p[1]) for p in pairs), dtype=np.int64, count=len(pairs))
        weights = np.repeat(np.asarray(nbytes, dtype=float), counts) * shares
        return (np.bincount(ids, weights=weights, minlength=size),
                np.bincount(ids, minlength=size) > 0)

    def _shares(self, parts: tuple) -> tuple[float, np.ndarray, np.ndarray]:
        """(largest latency, link ids, shares) of routes = prefixes x middles x suffixes."""
        sizes = [len(part) for part in parts]
        total = sizes[0] * sizes[1] * sizes[2]
        segments = [self._segment(part, total, size) for part, size in zip(parts, sizes)]
        return (self._latency(parts), np.concatenate([ids for ids, _ in segments]),
                np.concatenate([shares for _, shares in segments]))

    def _segment(self, part: tuple, total: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """(link ids, shares) of one part's links among `total` routes, cached per (part,
        total): each link is on (its routes in the part) x (total / size) routes."""
        key = (id(part) if size > 8 else part, total)
        hit = self._segments.get(key)
        if hit is None or hit[0] is not part and hit[0] != part:
            ids, counts = self._part_links(part)
            shares = self._repeated(total)[counts * (total // size)]
            hit = self._segments[key] = (part, (ids, shares))
        return hit[1]

    def _part_links(self, part: tuple) -> tuple[np.ndarray, np.ndarray]:
        """(link ids in order of first use, routes of `part` through each) of one part,
        cached by the part itself (a middle by identity: RouteSets keeps its middles)."""
        key = id(part) if len(part) > 8 else part
        hit = self._parts.get(key)
        if hit is None or hit[0] is not part and hit[0] != part:
            counts: Counter = Counter()
            for path in part:
                counts.update(zip(path, path[1:]))
            hit = self._parts[key] = (part, (
                np.fromiter(map(self.edge_id.__getitem__, counts), dtype=np.int64,
                            count=len(counts)),
                np.fromiter(counts.values(), dtype=np.int64, count=len(counts))))
        return hit[1]

    def _repeated(self, total: int) -> np.ndarray:
        """[1/total added k times from 0.0, as the per-route loop did, for k = 0..total]
        (np.cumsum adds in order, one element after another)."""
        hit = self._repeats.get(total)
        if hit is None:
            hit = self._repeats[total] = np.concatenate(
                ([0.0], np.cumsum(np.full(total, 1 / total))))
        return hit

    def _latency(self, parts: tuple) -> float:
        """Largest route latency, each summed from 0 in route order (module docstring);
        the sums reached after each part are cached per (sums before it, part)."""
        ends = frozenset((0,))
        for part in parts:
            key = (ends, id(part) if len(part) > 8 else part)
            hit = self._latencies.get(key)
            if hit is None or hit[0] is not part and hit[0] != part:
                hit = self._latencies[key] = (part, frozenset(
                    self._extend(start, path) for start in ends for path in part))
            ends = hit[1]
        return float(max(ends))

    def _extend(self, start, path) -> float:
        succ = self.graph._succ
        for a, b in zip(path, path[1:]):
            start = start + succ[a][b]["latency"]
        return start
