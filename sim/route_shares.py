"""Per GPU pair, what the alpha-beta estimate (sim.collective_algorithms.estimate_time)
needs of its equal-cost routes: the largest route latency (s) and the share of the
pair's bytes each link carries when they are split evenly over the routes (ideal ECMP),
as arrays of link ids and shares, so a phase's link loads are one numpy bincount.

Exactness (the numbers are those of the per-route loops this replaces, bit for bit):
- a link's share was 1/N (N routes) added once per route through it, from 0.0; here the
  same repeated addition, done once per (N, count) (`_repeated`); the count of routes
  through a link of a composed pair (topologies.route_sets: prefixes x middles x
  suffixes, whose parts share no link) is its count in its part times the other parts'
  sizes, the count over the listed routes;
- a route's latency was the sum of its links' latencies in route order, from 0; here the
  same sums, in the same order, prefix then middle then suffix;
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

from clustersim.topologies.route_sets import Composed, route_sets

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
        self.bandwidth = np.fromiter((bw for _, _, bw in graph.edges(data="bandwidth")),
                                     dtype=float, count=len(self.edge_id))
        self._pairs: dict[tuple, tuple[float, np.ndarray, np.ndarray]] = {}
        self._repeats: dict[tuple[int, int], float] = {}

    def of(self, src: Hashable, dst: Hashable) -> tuple[float, np.ndarray, np.ndarray]:
        hit = self._pairs.get((src, dst))
        if hit is None:
            composed = self.sets.compose(src, dst)
            if composed is None:  # as one part: the listed routes themselves
                paths = tuple(map(tuple, self.sets.routes(src, dst)))
                composed = Composed(paths, ((paths[0][-1],),), ((paths[0][-1],),))
            hit = self._pairs[(src, dst)] = self._shares(composed)
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

    def _shares(self, composed: Composed) -> tuple[float, np.ndarray, np.ndarray]:
        parts = (composed.prefixes, composed.middles, composed.suffixes)
        total = len(parts[0]) * len(parts[1]) * len(parts[2])
        counts: Counter = Counter()
        for part in parts:
            others = total // len(part)
            for path in part:
                for edge in zip(path, path[1:]):
                    counts[edge] += others
        ids = np.fromiter((self.edge_id[e] for e in counts), dtype=np.int64, count=len(counts))
        shares = np.array([self._repeated(total, c) for c in counts.values()], dtype=float)
        return self._latency(parts), ids, shares

    def _repeated(self, total: int, count: int) -> float:
        """1/total added `count` times from 0.0, as the per-route loop did."""
        key = (total, count)
        hit = self._repeats.get(key)
        if hit is None:
            share, hit = 1 / total, 0.0
            for _ in range(count):
                hit += share
            self._repeats[key] = hit
        return hit

    def _latency(self, parts: tuple) -> float:
        """Largest route latency, each summed from 0 in route order (module docstring)."""
        succ = self.graph._succ

        def extend(start, path):
            for a, b in zip(path, path[1:]):
                start = start + succ[a][b]["latency"]
            return start

        heads = {extend(0, p) for p in parts[0]}
        bodies = {extend(h, m) for h in heads for m in parts[1]}
        return float(max(extend(b, q) for b in bodies for q in parts[2]))
