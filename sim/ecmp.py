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

A collective phase asks for all its flows at once (`choose_many`): consecutive flows
through one switch pair's middles (a GPU's flows to the GPUs of one leaf) are chosen
from one reading of the counts, exactly as one at a time (`_choose_run` says why), and
a pair keeps only its turn (`turns`), not an object, when the phase has more than
KEEP_PAIRS flows (an all-to-all of 1,024 GPUs has a million pairs).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence
from operator import add, itemgetter

import networkx as nx

from clustersim.topologies.route_sets import Composed, route_sets


KEEP_PAIRS = 1 << 16
"""A phase of at most this many flows keeps its pairs' parts (a collective run again, as a
job's data-parallel all-reduces are, finds them kept); a larger one (an all-to-all of
1,024 GPUs has a million pairs) keeps only their turns."""


class _PairRoutes:
    """The equal-cost routes (link-id tuples, best first) of one (src, dst) pair."""

    def __init__(self, paths: list[tuple[int, ...]]):
        self.paths, self.turn = paths, 0  # turn: where the next round-robin scan starts
        shared = set(paths[0]).intersection(*paths[1:])
        varying = [[l for l in path if l not in shared] for path in paths]
        # Distinct simple paths of equal length each have the same number (>= 1) of
        # unshared links; `_varying(routed)[c * n + i]` is the count on route i's c-th.
        self.columns = len(varying[0])
        self._varying: Callable | None = None
        if len(paths) > 1:
            self._varying = itemgetter(*(row[c] for c in range(self.columns) for row in varying))
        # apart: no varying link on two routes (a choice then adds `columns` to the chosen
        # route's load and nothing to any other's: EcmpRoutes._choose_run)
        self.apart = len({l for row in varying for l in row}) == len(paths) * self.columns

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
        loads = self.loads(routed)
        least = min(loads)
        try:
            return loads.index(least, start)
        except ValueError:  # none from `start` on: the first from the beginning
            return loads.index(least)

    def loads(self, routed: list[int]) -> list[int]:
        """Each route's count summed over its varying links (n > 1)."""
        n = len(self.paths)
        values = self._varying(routed)
        loads = list(values[:n])
        for c in range(1, self.columns):
            loads = list(map(add, loads, values[c * n:(c + 1) * n]))
        return loads


class EcmpRoutes:
    """The flow network's route choice: `choose(src, dst)` (or `choose_many` for a whole
    phase) and the per-link count of unfinished flows it balances (`routed`). A pair's
    round-robin turn is kept in `turns` (absent: 0; only pairs with several routes)."""

    def __init__(self, graph: nx.DiGraph, link_index: dict[tuple, int], ecmp: bool = True):
        self.link_index, self.ecmp = link_index, ecmp
        self.sets = route_sets(graph)
        self._succ = graph._succ  # a plain dict: read once per new pair
        self.routed = [0] * len(link_index)  # unfinished flows routed over each link
        self.turns: dict[tuple[Hashable, Hashable], int] = {}
        self._pairs: dict[tuple[Hashable, Hashable], tuple] = {}  # pair -> `_pair`
        self._links: dict[tuple, tuple[int, ...]] = {}  # node path -> its link ids
        self._middles: dict[int, tuple] = {}  # id(RouteSets' middles) -> (them, routes)
        self._fronts: dict[tuple, tuple] = {}  # `_pair`: (prefix ids, middles) by source
        self._backs: dict[tuple, tuple[int, ...]] = {}  # and suffix ids by destination
        self._end_links: set[int] = set()  # link ids of every prefix and suffix so far
        self._middle_links: set[int] = set()  # and of every middle
        self._apart = True  # no link in both: a middle's choices never see an end's count

    def choose(self, src: Hashable, dst: Hashable) -> tuple[int, ...]:
        """Link ids of the route the next flow from src to dst takes; it is counted on
        them until released (`release_counts`)."""
        pair = (src, dst)
        found = self._pairs.get(pair)
        if found is None:
            found = self._pairs[pair] = self._pair(src, dst)
        return self._take(pair, *found)

    def choose_many(self, pairs: Sequence[tuple[Hashable, Hashable]]) -> list[tuple[int, ...]]:
        """`[self.choose(s, d) for s, d in pairs]`, the same choices and counts, with
        each run of consecutive pairs through one switch pair's middles (e.g. one GPU's
        flows to the GPUs of one leaf) chosen from one reading of the counts
        (`_choose_run`) and no per-pair object kept beyond its turn."""
        chosen: list[tuple[int, ...]] = []
        run: list = []  # [(pair, prefix ids, suffix ids)] through `run_middles`
        run_middles = None
        keep, kept = len(pairs) <= KEEP_PAIRS, self._pairs.get
        for pair in pairs:
            found = kept(pair) or self._pair(*pair, keep)
            prefix, middles, suffix = found
            if middles is not run_middles:
                if run:
                    chosen += self._choose_run(run_middles, run)
                    run = []
                run_middles = middles if len(middles.paths) > 1 and middles.apart else None
            if run_middles is None:
                chosen.append(self._take(pair, *found))
            else:
                run.append((pair, prefix, suffix))
        if run:
            chosen += self._choose_run(run_middles, run)
        return chosen

    def release(self, links: Sequence[int]) -> None:
        """A flow on `links` (a route: no link twice) finished."""
        self.release_counts(links, [1] * len(links))

    def release_counts(self, links: Sequence[int], counts: Sequence[int]) -> None:
        """counts[i] flows on links[i] finished (floor at 0: links given to the network
        directly were never counted)."""
        routed = self.routed
        for link, count in zip(links, counts):
            left = routed[link] - count
            routed[link] = left if left > 0 else 0

    # --- one pair at a time ------------------------------------------------------------------
    def _take(self, pair, prefix: tuple[int, ...], middles: _PairRoutes,
              suffix: tuple[int, ...]) -> tuple[int, ...]:
        paths = middles.paths
        n = len(paths)
        if n == 1:
            choice = prefix + paths[0] + suffix if prefix or suffix else paths[0]
        else:
            turn = self.turns.get(pair, 0)
            self.turns[pair] = turn + 1
            choice = prefix + paths[middles.least_index(self.routed, turn % n)] + suffix
        routed = self.routed
        for link in choice:
            routed[link] += 1
        return choice

    # --- a run through one switch pair ----------------------------------------------------------
    def _choose_run(self, middles: _PairRoutes, run: list) -> list[tuple[int, ...]]:
        """The choices of consecutive pairs through `middles` (several routes whose
        varying links are all distinct, `_PairRoutes.apart`), as `_take` one after another
        would make them. Exact: while the run lasts only its own choices change the
        counts its choice reads (its pairs' prefixes and suffixes share no link with any
        middle, `_apart`), and a choice adds `columns` to the chosen route's load and
        nothing to the others'; so the choices are those of a heap of (route load, place
        in round-robin order from the turn) whose least entry is taken and put back
        `columns` heavier: the least-loaded route, ties to the first from the turn, as
        `least_index`, without reading the counts again. Pairs at different turns, or
        ends sharing links with middles, are taken one at a time."""
        if len(run) == 1:
            pair, prefix, suffix = run[0]
            return [self._take(pair, prefix, middles, suffix)]
        n, width = len(middles.paths), middles.columns
        turns_of = self.turns.get
        turns = [turns_of(pair, 0) for pair, _, _ in run]
        start = turns[0] % n
        if not self._apart or (turns.count(turns[0]) != len(turns) and any(
                t % n != start for t in turns)):
            return [self._take(pair, prefix, middles, suffix) for pair, prefix, suffix in run]
        heap = [(load, (i - start) % n, i) for i, load in enumerate(middles.loads(self.routed))]
        heapq.heapify(heap)
        picks = []
        for _ in run:
            load, place, pick = heap[0]
            picks.append(pick)
            heapq.heapreplace(heap, (load + width, place, pick))
        chosen, paths, routed, self_turns = [], middles.paths, self.routed, self.turns
        for (pair, prefix, suffix), pick, turn in zip(run, picks, turns):
            self_turns[pair] = turn + 1
            choice = prefix + paths[pick] + suffix
            for link in choice:
                routed[link] += 1
            chosen.append(choice)
        return chosen

    # --- a pair's parts --------------------------------------------------------------------------
    def _pair(self, src, dst, keep: bool = True) -> tuple:
        """(prefix ids, middles as `_PairRoutes`, suffix ids) of a pair (kept unless
        `keep` is False). The prefix and middles are a function of the source and the
        destination's funnel node, widest width and hops; the suffix of the destination
        and the source's (topologies.route_sets: `joined`): both are cached per those,
        so a million pairs compose from a few thousand parts."""
        if dst in self._succ[src]:  # linked: the one fewest-hop route (routing.routes)
            hit = self._pairs[(src, dst)] = ((), _PairRoutes([(self.link_index[(src, dst)],)]), ())
            return hit
        ends, composed = self.sets.ends(src, dst), None
        if ends is not None:
            head, tail = ends
            front_key, back_key = (src, tail.shape), (dst, head.shape)  # shapes: ints
            front, back = self._fronts.get(front_key), self._backs.get(back_key)
            if front is None or back is None:
                composed = self.sets.compose_ends(head, tail)
                if composed is not None and len(composed[0]) == 1 == len(composed[2]):
                    prefixes, middles, suffixes = composed
                    front = self._fronts[front_key] = (self._end_ids(prefixes[0]),
                                                       self._middles_of(middles))
                    back = self._backs[back_key] = self._end_ids(suffixes[0])
            if front is not None and back is not None:
                hit = (front[0], front[1], back)
                if keep:
                    self._pairs[(src, dst)] = hit
                return hit
        return self._whole(src, dst, composed)

    def _whole(self, src, dst, composed: tuple | None) -> tuple:
        """A pair that does not compose (`composed` None), or composes with several
        prefixes or suffixes: its whole routes as the middles, empty ends; always kept."""
        found = Composed(*composed).paths() if composed else self.sets.routes(src, dst)
        routes = [self._ids(tuple(p)) for p in (found if self.ecmp else found[:1])]
        hit = self._pairs[(src, dst)] = ((), _PairRoutes(routes), ())
        return hit

    def _middles_of(self, middles: tuple) -> _PairRoutes:
        hit = self._middles.get(id(middles))  # RouteSets keeps them: ids hold
        if hit is None:
            kept = middles if self.ecmp else middles[:1]
            index = self.link_index.__getitem__  # not kept per path: one pair's middles
            routes = _PairRoutes([tuple(map(index, zip(m, m[1:]))) for m in kept])
            hit = self._middles[id(middles)] = (middles, routes)
            links = {link for path in routes.paths for link in path}
            self._middle_links |= links
            self._apart = self._apart and self._end_links.isdisjoint(links)
        return hit[1]

    def _end_ids(self, path: tuple) -> tuple[int, ...]:
        hit = self._links.get(path)
        if hit is None:
            hit = self._ids(path)
            self._end_links.update(hit)
            self._apart = self._apart and self._middle_links.isdisjoint(hit)
        return hit

    def _ids(self, path: tuple) -> tuple[int, ...]:
        hit = self._links.get(path)
        if hit is None:
            index = self.link_index
            hit = self._links[path] = tuple(index[(a, b)] for a, b in zip(path, path[1:]))
        return hit
