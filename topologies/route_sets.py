"""Equal-cost route sets composed from the two end GPUs' funnels and a switch-pair middle,
cached: the same paths, in the same order, as `topologies.routing.routes`, found once per
GPU and once per switch pair instead of once per GPU pair (a 1,024-GPU all-to-all asks
for a million pairs, which routes() finds in minutes).

The funnel of a GPU s (`forward`; `backward` for a destination, on the reversed links) is
the layered breadth-first search from s through non-GPU nodes (routing rule 2: GPUs are
end points) until a layer holds a single node f, k hops out; the GPUs it meets on the way
are `near`. A route's node at hop i is at distance i from s, so every fewest-hop route
from s to a GPU d not near s passes f at hop k. With d's funnel b (j hops) and the two
funnels' regions (the nodes searched) disjoint, or meeting only in f == b, every route
of (s, d) is a prefix + a middle + a suffix: a fewest-hop s..f path, a fewest-hop f..b
path through switches only, a fewest-hop b..d path; and every such concatenation is a
route (its length is the distance, so it is a simple path avoiding other GPUs). The set
is a product, hence
- its widest bottleneck (routing rule 3) is the least of the three parts' widest, and
  its widest routes are the products of the parts' paths at least that wide;
- sorted by node names (rule 4), it is ordered by prefix, then middle, then suffix, each
  part sorted on its own (a part's paths have one length), provided no two paths of a
  part have equal keys (checked; such a pair takes routes() itself).
Two GPUs of one host meet within the source's funnel search: their routes are read off
that search's back pointers (`_near_routes`: it expanded non-GPU nodes layer by layer, so
it holds every fewest-hop path between them; rules 3-4 are then applied as routes()
does). Every other pair (a GPU with no funnel; a route beyond MAX_ROUTE_HOPS links or
with more than MAX_EQUAL_COST_PATHS paths; GPUs relaying; paths with equal sort keys)
is answered by routes() itself, so nothing differs there either.
tests/test_fast_network.py checks the composed sets against routes() on the presets.

Cached for the life of the object: each GPU's two funnels (with their search's back
pointers), each (f, b, bottleneck) middle and each join of two funnels' nodes, widths and
hops (`joined`), and the routes of each pair that does not compose. A middle is searched
once per (ways out of f, ways into b, bottleneck) and renamed for alike switch pairs
(`RouteSets._search`: why that is exact). `route_sets(graph)`
keeps one RouteSets per graph object (the flow networks and the alpha-beta estimate of a
graph share it) and starts a new one when the graph's node or edge count has changed;
like the per-pair caches it replaces, it assumes links keep their bandwidths.
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Hashable
from dataclasses import dataclass, field

import networkx as nx

from .routing import MAX_EQUAL_COST_PATHS, MAX_ROUTE_HOPS, fewest_hop_paths, path_order_key
from .routing import routes as find_routes

MAX_FUNNEL_HOPS = 6  # a funnel deeper than this is not looked for (routes() answers)
MAX_FUNNEL_WIDTH = 256  # nor one whose search layers hold more nodes
_MAX_NEAR_PATHS = 4096  # a GPU pair in one funnel with more paths takes routes() itself

Path = tuple[Hashable, ...]
_BY_GRAPH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def route_sets(graph: nx.DiGraph) -> RouteSets:
    """The RouteSets of `graph` (module docstring: one per graph object)."""
    size = (graph.number_of_nodes(), graph.number_of_edges())
    hit = _BY_GRAPH.get(graph)
    if hit is None or hit[0] != size:
        hit = _BY_GRAPH[graph] = (size, RouteSets(graph))
    return hit[1]


@dataclass(frozen=True)
class Funnel:
    """Where every route out of (into) a GPU narrows to one node: `node`, `hops` links
    from the GPU; `chains` the fewest-hop paths between them (GPU first when forward, GPU
    last when backward), sorted, with their bottleneck `widths` (bytes/s); `region` the
    nodes searched, `near` the GPUs met within `hops` (each: its depth, the nodes it is
    met from); `widest` its widest chain's width; `shape` an int naming (node, widest,
    hops) within its RouteSets (equal triples, equal ints): what a join with another
    funnel depends on, an int because millions of pairs look it up."""

    node: Hashable
    hops: int
    region: frozenset
    near: dict = field(compare=False, repr=False)
    chains: tuple[Path, ...]
    widths: tuple[float, ...]
    shape: int
    back: dict = field(default_factory=dict, compare=False, repr=False)
    widest: float = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "widest", max(self.widths))
        object.__setattr__(self, "_narrowest", min(self.widths))

    def at_least(self, floor: float) -> tuple[Path, ...]:
        if floor <= self._narrowest:
            return self.chains
        return tuple(c for c, w in zip(self.chains, self.widths) if w >= floor)


@dataclass(frozen=True)
class Composed:
    """A pair's routes as prefixes x middles x suffixes (each sorted; consecutive parts
    share their joining node)."""

    prefixes: tuple[Path, ...]
    middles: tuple[Path, ...]
    suffixes: tuple[Path, ...]

    def paths(self) -> list[list]:
        return [[*p, *m[1:], *q[1:]] for p in self.prefixes for m in self.middles
                for q in self.suffixes]


class RouteSets:
    """`routes(graph, src, dst)` answered from cached parts (module docstring)."""

    def __init__(self, graph: nx.DiGraph):
        self.graph = graph
        self._gpus = frozenset(n for n, kind in graph.nodes(data="type") if kind == "gpu")
        self._forward: dict = {}
        self._backward: dict = {}
        self._widest: dict = {}
        self._middles: dict = {}
        self._alike: dict = {}  # (ways out, ways in, floor) -> a searched pair (`_search`)
        self._ways_of: dict = {}  # (node, forward) -> `_ways`
        self._listed: dict = {}  # (src, dst) -> routes() of a pair that does not compose
        self._joins: dict = {}  # (head shape, tail shape) -> `joined`
        self._shapes: dict = {}  # (node, widest, hops) -> its int (Funnel.shape)

    def routes(self, src, dst) -> list[list]:
        """Exactly `topologies.routing.routes(graph, src, dst)` (a new list)."""
        composed = self.compose(src, dst)
        if composed:
            return composed.paths()
        listed = self._listed.get((src, dst))
        if listed is None:
            listed = self._listed[(src, dst)] = (self._near_routes(src, dst)
                                                 or find_routes(self.graph, src, dst))
        return [list(p) for p in listed]

    def compose(self, src, dst) -> Composed | None:
        """The routes of (src, dst) as a product of parts, or None where the module
        docstring's conditions fail (then ask routes())."""
        parts = self.compose_parts(src, dst)
        return None if parts is None else Composed(*parts)

    def compose_parts(self, src, dst) -> tuple[tuple, tuple, tuple] | None:
        """`compose` as a plain (prefixes, middles, suffixes), for callers asking for
        many pairs. What depends on more than the two funnels' nodes and widths (the
        pair's own exclusions: GPUs met in a funnel, overlapping regions) is checked per
        pair (`ends`); the rest once per (f, b, widths, hops) (`joined`)."""
        ends = self.ends(src, dst)
        return None if ends is None else self.compose_ends(*ends)

    def compose_ends(self, head: Funnel, tail: Funnel) -> tuple[tuple, tuple, tuple] | None:
        """`compose_parts` of a pair whose `ends` are (head, tail)."""
        joined = self.joined(head, tail)
        if joined is None:
            return None
        best, middle = joined
        prefixes, suffixes = head.at_least(best), tail.at_least(best)
        if len(prefixes) * len(middle) * len(suffixes) > MAX_EQUAL_COST_PATHS:
            return None
        return prefixes, middle, suffixes

    def ends(self, src, dst) -> tuple[Funnel, Funnel] | None:
        """(src's forward funnel, dst's backward funnel) when the pair's own exclusions
        allow composing its routes from them (module docstring), else None."""
        head, tail = self._forward.get(src), self._backward.get(dst)
        if head is None or tail is None:
            if src == dst or src not in self.graph or dst not in self.graph:
                return None
            head, tail = self.forward(src), self.backward(dst)
            if head is None or tail is None:
                return None
        if dst in head.near or src in tail.near:
            return None
        f = head.node
        if f == tail.node:
            if head.region & tail.region != {f}:
                return None
        elif not head.region.isdisjoint(tail.region):
            return None
        return head, tail

    def joined(self, head: Funnel, tail: Funnel) -> tuple[float, tuple[Path, ...]] | None:
        """(bottleneck, middles) joining two funnels, or None; a function of their
        nodes, widest widths and hops (cached per those: their `shape`s)."""
        key = (head.shape, tail.shape)
        joined = self._joins.get(key, False)
        if joined is False:
            joined = self._joins[key] = self._join(head.node, tail.node, head.widest,
                                                   tail.widest, head.hops, tail.hops)
        return joined

    def _join(self, f, b, head_widest: float, tail_widest: float, head_hops: int,
              tail_hops: int) -> tuple[float, tuple[Path, ...]] | None:
        """(bottleneck, middles) joining funnels ending at f and b, or None."""
        if f == b:
            middle: tuple[Path, ...] | None = ((f,),)
            widest = math.inf
        else:
            widest, middle = self._widest.get((f, b)) or self._middle_widest(f, b)
            if middle is None:
                return None
        best = min(head_widest, widest, tail_widest)
        if best < widest and f != b:
            middle = self._middle(f, b, best)
        if not middle or head_hops + len(middle[0]) - 1 + tail_hops > MAX_ROUTE_HOPS:
            return None
        return best, middle

    def forward(self, gpu) -> Funnel | None:
        if gpu not in self._forward:
            self._forward[gpu] = self._funnel(gpu, self.graph._succ, forward=True)
        return self._forward[gpu]

    def backward(self, gpu) -> Funnel | None:
        if gpu not in self._backward:
            self._backward[gpu] = self._funnel(gpu, self.graph._pred, forward=False)
        return self._backward[gpu]

    def _funnel(self, end, adj: dict, forward: bool) -> Funnel | None:
        gpus = self._gpus
        dist, back, front, near = {end: 0}, {end: []}, [end], {}
        for depth in range(1, MAX_FUNNEL_HOPS + 1):
            layer = []
            for u in front:
                for v in adj[u]:
                    if v in gpus:
                        if v != end:  # near[v]: (its depth, the nodes it is met from)
                            met = near.get(v)
                            if met is None:
                                near[v] = (depth, [u])
                            elif met[0] == depth:
                                met[1].append(u)
                        continue
                    seen = dist.get(v)
                    if seen is None:
                        dist[v], back[v] = depth, [u]
                        layer.append(v)
                    elif seen == depth:
                        back[v].append(u)
            if not layer or len(layer) > MAX_FUNNEL_WIDTH:
                return None
            if len(layer) == 1:
                return self._funnel_of(end, layer[0], depth, dist, back, near, forward)
            front = layer
        return None

    def _funnel_of(self, end, node, hops: int, dist: dict, back: dict, near: dict,
                   forward: bool) -> Funnel | None:
        chains: list[list] = [[node]]  # back pointers lead one layer nearer the GPU
        for _ in range(hops):
            chains = [[*c, u] for c in chains for u in back[c[-1]]]
        paths = _sorted_distinct([tuple(reversed(c)) if forward else tuple(c) for c in chains])
        if paths is None:
            return None
        succ = self.graph._succ
        widths = tuple(min(succ[a][b]["bandwidth"] for a, b in zip(p, p[1:])) for p in paths)
        shape = self._shapes.setdefault((node, max(widths), hops), len(self._shapes))
        return Funnel(node, hops, frozenset(dist), near, paths, widths, shape, back)

    def _near_routes(self, src, dst) -> list[list] | None:
        """routes(src, dst) for a GPU met in src's funnel search (two GPUs of one host),
        from that search's back pointers, or None (ask routes()). Exact: the search
        expanded only non-GPU nodes, layer by layer, so dst's first layer is its
        distance through non-GPU nodes (rules 1-2), and the back pointers give every such
        fewest-hop path; rule 3 keeps the widest, rule 4 sorts (`_sorted_distinct`)."""
        head = self.forward(src) if src in self.graph else None
        if head is None or dst not in head.near:
            return None
        chains = [[dst, u] for u in head.near[dst][1]]
        while chains[0][-1] != src:
            if len(chains) > _MAX_NEAR_PATHS:
                return None
            chains = [[*c, u] for c in chains for u in head.back[c[-1]]]
        succ = self.graph._succ
        widths = [min(succ[a][b]["bandwidth"] for a, b in zip(c[1:], c)) for c in chains]
        widest = max(widths)
        return _sorted_distinct([c[::-1] for c, w in zip(chains, widths) if w >= widest])

    def _middle_widest(self, a, b) -> tuple[float, tuple[Path, ...] | None]:
        """(widest bottleneck, the widest middles) from a to b; (0.0, None) if none."""
        hit = self._widest[(a, b)] = self._search(a, b, None)
        if hit[0]:
            self._middles[(a, b, hit[0])] = hit[1]
        return hit

    def _middle(self, a, b, floor: float) -> tuple[Path, ...] | None:
        key = (a, b, floor)
        if key not in self._middles:
            self._middles[key] = self._search(a, b, floor)[1]
        return self._middles[key]

    def _search(self, a, b, floor: float | None) -> tuple[float, tuple[Path, ...] | None]:
        """(widest bottleneck, the sorted fewest-hop a..b paths at least `floor` wide, or
        None) for switches a != b: `fewest_hop_paths` and `_sorted_distinct`, or those of
        an earlier pair (a0, b0) with the same ways out of a and into b (`_ways`),
        renamed. Exact (no test can tell): for a and b not linked, the fewest-hop
        routes a..b are a0..b0's with a0 and b0 renamed, the same count, widths and
        order, wherever neither a nor b is inside them. A route a..b of j < k =
        dist(a0, b0) links would give, renamed back, a walk a0..b0 of j links; every
        route a..b of k links gives one of a0..b0 (with a0 or b0 inside it, a0..b0 would
        be shorter than k). Its first hop is one of a's ways out (a switch with a
        non-GPU neighbour other than a), its last one of b's ways in, its inside
        untouched; sort keys (rule 4) differ only in the first and last names, which
        all routes of a pair share. A fat-tree's leaves of one pod share their ways to
        the spines: a 16,384-GPU all-reduce on llama3-24k-roce searches 22 switch pairs
        instead of 3,580."""
        key = (self._ways(a, self.graph._succ), self._ways(b, self.graph._pred), floor)
        known = self._alike.get(key)
        if known is not None:
            a0, b0, inside, hit = known
            if (a, b) == (a0, b0):
                return hit
            if a not in inside and b not in inside and b not in self.graph._succ[a]:
                widest, middles = hit
                return widest, middles and tuple((a, *m[1:-1], b) for m in middles)
        found = fewest_hop_paths(self.graph, a, b, floor=floor)
        if found is None or found[1] is None or not found[1]:
            hit = (0.0, None)
        else:
            hit = (found[0], _sorted_distinct(found[1]))
        if known is None and b not in self.graph._succ[a] and (
                found is None or found[1] is not None):  # a count alone names no inside
            inside = frozenset(n for m in (found[1] if found else ()) for n in m[1:-1])
            self._alike[key] = (a, b, inside, hit)
        return hit

    def _ways(self, node, adj: dict) -> frozenset:
        """The first (adj: successors) or last (predecessors) hops a route through
        switches can take from or to `node`: (neighbour, link bandwidth) for each
        non-GPU neighbour with a non-GPU neighbour other than `node` (a NIC between a
        leaf and its GPU is no way through)."""
        ways = self._ways_of.get((node, adj is self.graph._succ))
        if ways is None:
            gpus = self._gpus
            ways = self._ways_of[(node, adj is self.graph._succ)] = frozenset(
                (v, link["bandwidth"]) for v, link in adj[node].items()
                if v not in gpus and any(w != node and w not in gpus for w in adj[v]))
        return ways


def _sorted_distinct(paths: list) -> tuple[Path, ...] | None:
    """`paths` in routes()' order, or None if two of them have equal sort keys (their
    order in routes() would then depend on its search, not on the names)."""
    if len(paths) == 1:
        return (tuple(paths[0]),)
    keys = {tuple(p): path_order_key(p) for p in paths}
    ordered = sorted(keys, key=keys.__getitem__)
    if any(keys[a] == keys[b] for a, b in zip(ordered, ordered[1:])):
        return None
    return tuple(ordered)
