"""Which equal-cost route a new flow takes: the one whose links carry the fewest unfinished
flows (routed or running), ties in per-pair round-robin order (sim.flows: the rule and
why). Units: link ids (the flow network's numbering) and flow counts.

A pair's routes come from topologies.route_sets: where they compose as one prefix x the
middles of a switch pair x one suffix (every pair of GPUs on different hosts of the
builders' fabrics), the pair keeps only its prefix and suffix link ids and its turn, and
shares the middles' link ids and column table with every pair through the same switch
pair. The choice is exact: the prefix and suffix links are on every route of the pair,
so they are among the links all its routes share, which add the same count to every
route and never change the choice; what is compared, route by route, are the middles'
links that not all middles share, in the same order as `_PairRoutes` over the whole
routes, and the round robin starts at the pair's own turn as before. Pairs that do not
compose keep their full routes (`_PairRoutes`), as sim.flows did for every pair.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from operator import add, itemgetter

import networkx as nx

from clustersim.topologies.route_sets import Composed, route_sets


class _PairRoutes:
    """The equal-cost routes (link-id tuples, best first) of one (src, dst) pair."""

    def __init__(self, paths: list[tuple[int, ...]]):
        self.paths, self.turn = paths, 0  # turn: where the next round-robin scan starts
        shared = set(paths[0]).intersection(*paths[1:])
        varying = [[l for l in path if l not in shared] for path in paths]
        # Distinct simple paths of equal length each have the same number (>= 1) of
        # unshared links; `_varying(routed)[c * n + i]` is the count on route i's c-th.
        self._columns = len(varying[0])
        self._varying: Callable | None = None
        if len(paths) > 1:
            self._varying = itemgetter(*(row[c] for c in range(self._columns) for row in varying))

    def least_loaded(self, routed: list[int]) -> tuple[int, ...]:
        """The route whose links carry the fewest of `routed`, first in round-robin order
        from this pair's turn (which advances by one per call)."""
        n = len(self.paths)
        if n == 1:
            return self.paths[0]
        start, self.turn = self.turn % n, self.turn + 1
        return self.paths[self.least_index(routed, start)]

    def least_index(self, routed: list[int], start: int) -> int:
        """Index of the least-loaded route, ties to the first from `start` (n > 1)."""
        n = len(self.paths)
        values = self._varying(routed)
        loads = list(values[:n])
        for c in range(1, self._columns):
            loads = list(map(add, loads, values[c * n:(c + 1) * n]))
        rotated = loads[start:] + loads[:start]
        return (start + rotated.index(min(rotated))) % n


class _ComposedPair:
    """A composed pair's own part of the choice: its prefix and suffix link ids, its turn,
    and the middles it shares with its switch pair."""

    __slots__ = ("prefix", "middles", "suffix", "turn")

    def __init__(self, prefix: tuple[int, ...], middles: _PairRoutes, suffix: tuple[int, ...]):
        self.prefix, self.middles, self.suffix, self.turn = prefix, middles, suffix, 0

    def least_loaded(self, routed: list[int]) -> tuple[int, ...]:
        paths = self.middles.paths
        n = len(paths)
        if n == 1:
            return self.prefix + paths[0] + self.suffix
        start, self.turn = self.turn % n, self.turn + 1
        return self.prefix + paths[self.middles.least_index(routed, start)] + self.suffix


class EcmpRoutes:
    """The flow network's route choice: `choose(src, dst)` and the per-link count of
    unfinished flows it balances (`routed`)."""

    def __init__(self, graph: nx.DiGraph, link_index: dict[tuple, int], ecmp: bool = True):
        self.link_index, self.ecmp = link_index, ecmp
        self.sets = route_sets(graph)
        self.routed = [0] * len(link_index)  # unfinished flows routed over each link
        self._pairs: dict[tuple[Hashable, Hashable], _PairRoutes | _ComposedPair] = {}
        self._links: dict[tuple, tuple[int, ...]] = {}  # node path -> its link ids
        self._middles: dict[int, tuple] = {}  # id(RouteSets' middles) -> (them, routes)

    def choose(self, src: Hashable, dst: Hashable) -> tuple[int, ...]:
        """Link ids of the route the next flow from src to dst takes; it is counted on
        them until `release`d."""
        pair = self._pairs.get((src, dst))
        if pair is None:
            pair = self._pairs[(src, dst)] = self._pair(src, dst)
        choice = pair.least_loaded(self.routed)
        routed = self.routed
        for link in choice:
            routed[link] += 1
        return choice

    def release(self, links: Sequence[int]) -> None:
        """A flow on `links` finished (floor at 0: links given to the network directly
        were never counted)."""
        routed = self.routed
        for link in links:
            if routed[link]:
                routed[link] -= 1

    def _pair(self, src, dst) -> _PairRoutes | _ComposedPair:
        composed = self.sets.compose(src, dst)
        if composed is None or len(composed.prefixes) > 1 or len(composed.suffixes) > 1:
            found = composed.paths() if composed else self.sets.routes(src, dst)
            return _PairRoutes([self._ids(tuple(p)) for p in (found if self.ecmp else found[:1])])
        return _ComposedPair(self._ids(composed.prefixes[0]), self._middles_of(composed),
                             self._ids(composed.suffixes[0]))

    def _middles_of(self, composed: Composed) -> _PairRoutes:
        hit = self._middles.get(id(composed.middles))  # RouteSets keeps them: ids hold
        if hit is None:
            middles = composed.middles if self.ecmp else composed.middles[:1]
            hit = self._middles[id(composed.middles)] = (
                composed.middles, _PairRoutes([self._ids(m) for m in middles]))
        return hit[1]

    def _ids(self, path: tuple) -> tuple[int, ...]:
        hit = self._links.get(path)
        if hit is None:
            index = self.link_index
            hit = self._links[path] = tuple(index[(a, b)] for a, b in zip(path, path[1:]))
        return hit
