"""Routes through a topology graph: equal-cost multi-paths (ECMP), path bandwidth/latency
and host membership. Units: bandwidth bytes/s, latency seconds.

The routing rule (what `routes` returns, best first):
1. fewest hops (directed edges);
2. GPUs are end points, not routers: a path passes through no GPU other than its two
   ends, unless no such path exists (direct GPU-GPU link meshes; then GPUs may relay);
3. of those, only the widest ones (largest bottleneck bandwidth). This keeps intra-node
   traffic on NVLink (gpu -> nvswitch -> gpu, 2 hops) rather than over the equally short
   but slower gpu -> host CPU -> gpu PCIe path;
4. sorted by node ids in natural order (`spine2` before `spine10`), so `route` (= the
   first) is deterministic and ECMP spreads over spines in index order.

Bounds (a topology file may describe any graph): a route has at most MAX_ROUTE_HOPS links
(64; a 3-tier fabric's GPU-to-GPU route has about 10) and a pair at most
MAX_EQUAL_COST_PATHS equal-cost paths (65,536; the largest builder fabric has
MAX_LEAF_SPINE_LINKS / leaves spines, a few hundred); the paths are counted before they
are listed, so a graph with exponentially many (layers of parallel switches) is refused
in one TopologyError naming the pair, not enumerated.

Cost: a bidirectional layered breadth-first search from both ends that meets in the
middle, so only the neighbourhoods of the two GPUs and the spine layer are visited; no
state is kept between calls, so mutating the graph never leaves stale routes (callers
that route a pair often, like the flow network, cache per pair). Measured (Python 3.11,
networkx 3.6, one core of a shared 2-core VM, best of 3): `dgx-h100-x128-ndr-ft` (1024
GPUs, 32 spines) 0.25 ms per call averaged over 2,000 random GPU pairs (0.23 ms for a
cross-spine pair with 32 paths, 0.013 ms within a host); `-2to1` (16 spines) 0.17 ms;
`selene-a100` (3072 GPUs, 16 spines) 0.22 ms; `dgx-h100-x16-ndr` 0.13 ms.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache

import networkx as nx

from .errors import TopologyError

MAX_ROUTE_HOPS = 64
MAX_EQUAL_COST_PATHS = 65_536


def routes(graph: nx.DiGraph, src: str, dst: str, limit: int | None = None) -> list[list[str]]:
    """All equal-cost paths src..dst (inclusive), best first (module docstring: the rule).

    `limit` (positive int) keeps only the first `limit` paths. `[[src]]` when src == dst.
    """
    for node in (src, dst):
        if node not in graph:
            raise TopologyError(f"route: unknown node {node!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise TopologyError(f"routes: limit must be a positive integer or None, got {limit!r}")
    if src == dst:
        return [[src]]
    if graph.has_edge(src, dst):  # the one fewest-hop path, through no other node
        return [[src, dst]]
    found = _equal_cost_paths(graph, src, dst, gpu_transit=False)
    if not found:
        found = _equal_cost_paths(graph, src, dst, gpu_transit=True)
    if found is None:
        raise TopologyError(f"route: no path from {src!r} to {dst!r} of at most "
                            f"{MAX_ROUTE_HOPS} links (topologies.routing.MAX_ROUTE_HOPS)")
    if not found:
        raise TopologyError(f"route: no path from {src!r} to {dst!r}")
    if len(found) > 1:
        keys = {n: _natural_key(str(n)) for n in {n for path in found for n in path}}
        found.sort(key=lambda path: [keys[n] for n in path])
    return found if limit is None else found[:limit]


def route(graph: nx.DiGraph, src: str, dst: str) -> list[str]:
    """The first of `routes(graph, src, dst)`: a fewest-hop, widest path, deterministic."""
    return routes(graph, src, dst, limit=1)[0]


def path_bandwidth(graph: nx.DiGraph, path: list[str]) -> float:
    """Bottleneck bandwidth of `path` in bytes/s (min over its edges; inf for one node)."""
    return min((graph.edges[u, v]["bandwidth"] for u, v in zip(path, path[1:])), default=math.inf)


def path_latency(graph: nx.DiGraph, path: list[str]) -> float:
    """Total latency of `path` in seconds (sum over its edges; 0 for one node)."""
    return float(sum(graph.edges[u, v]["latency"] for u, v in zip(path, path[1:])))


def host_of(graph: nx.DiGraph, gpu: str) -> int:
    """The host (node) index of GPU node `gpu`."""
    if gpu not in graph or graph.nodes[gpu].get("type") != "gpu":
        raise TopologyError(f"{gpu!r} is not a gpu node of topology {graph.graph.get('name')!r}")
    return graph.nodes[gpu]["host"]


def same_host(graph: nx.DiGraph, a: str, b: str) -> bool:
    """Whether GPU nodes `a` and `b` sit in the same host."""
    return host_of(graph, a) == host_of(graph, b)


def path_order_key(path: list) -> list[tuple]:
    """The key `routes` sorts a pair's equal-cost paths by (rule 4)."""
    return [_natural_key(str(n)) for n in path]


@lru_cache(maxsize=1 << 16)
def _natural_key(name: str) -> tuple:
    # 'rail3.12' -> ('rail', 3, '.', 12, ''): digit runs compare as numbers.
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _equal_cost_paths(graph: nx.DiGraph, src, dst, gpu_transit: bool) -> list[list] | None:
    """Fewest-hop, widest paths src..dst by bidirectional layered BFS (unsorted); [] when
    there is none, None when none has at most MAX_ROUTE_HOPS links."""
    found = fewest_hop_paths(graph, src, dst, gpu_transit)
    if found is None:
        return None
    widest, paths = found
    if paths is None:
        raise TopologyError(f"route: {widest:,} equal-cost paths from {src!r} to {dst!r}, "
                            f"above the limit of {MAX_EQUAL_COST_PATHS:,} "
                            f"(topologies.routing.MAX_EQUAL_COST_PATHS)")
    return paths


def fewest_hop_paths(graph: nx.DiGraph, src, dst, gpu_transit: bool = False,
                     floor: float | None = None) -> tuple[float, list[list] | None] | None:
    """(widest bottleneck, the fewest-hop paths src..dst whose every link is at least
    `floor` bytes/s wide, unsorted), `floor` defaulting to the widest: `routes`' search
    (rules 1-3), also used by topologies.route_sets to list a route's middle at the
    bottleneck its two ends set. (0.0, []) when there is no path, None when none has at
    most MAX_ROUTE_HOPS links, (count, None) when more than MAX_EQUAL_COST_PATHS qualify.
    """
    nodes, succ, pred = graph._node, graph._succ, graph._pred  # plain dicts: faster than views
    # Per side: BFS depth of each node, its neighbours one layer nearer that side's end,
    # and the widest bottleneck (bytes/s) from that end (edges of a layer are final before
    # the next layer is expanded). adj[u][v] is the attr dict of the link in either side.
    fdist, fback, fwide, ffront = {src: 0}, {src: []}, {src: math.inf}, [src]
    bdist, bback, bwide, bfront = {dst: 0}, {dst: []}, {dst: math.inf}, [dst]
    meet: list = []
    while ffront and bfront and not meet:
        if fdist[ffront[0]] + bdist[bfront[0]] >= MAX_ROUTE_HOPS:
            return None
        forward = len(ffront) <= len(bfront)
        dist, back, wide, front, adj, end, other = (
            (fdist, fback, fwide, ffront, succ, dst, bdist) if forward
            else (bdist, bback, bwide, bfront, pred, src, fdist))
        depth, layer = dist[front[0]] + 1, []
        for u in front:
            reach = wide[u]
            for v, link in adj[u].items():
                seen = dist.get(v)
                if seen is None:
                    if gpu_transit or v == end or nodes[v].get("type") != "gpu":
                        bw = link["bandwidth"]
                        dist[v], back[v], wide[v] = depth, [u], bw if bw < reach else reach
                        layer.append(v)
                elif seen == depth:
                    back[v].append(u)
                    bw = link["bandwidth"]
                    bw = bw if bw < reach else reach
                    if bw > wide[v]:
                        wide[v] = bw
        meet = [v for v in layer if v in other]
        if forward:
            ffront = layer
        else:
            bfront = layer
    if not meet:
        return 0.0, []
    widest = max(min(fwide[m], bwide[m]) for m in meet)
    best = widest if floor is None else floor
    meet = [m for m in meet if min(fwide[m], bwide[m]) >= best]
    heads = _Chains(fback, fwide, succ, best, fdist, meet)
    tails = _Chains(bback, bwide, pred, best, bdist, meet)
    count = sum(heads.count[m] * tails.count[m] for m in meet)
    if count > MAX_EQUAL_COST_PATHS:
        return count, None
    return widest, [head[::-1] + tail[1:]
                    for m in meet for head in heads.of(m) for tail in tails.of(m)]


class _Chains:
    """Node-to-end chains (node first) of one search side with every link at least `best`
    wide, for the nodes that lead back from `targets`: counted first (`count`), listed on
    demand (`of`), both in order of BFS depth, so no recursion however long a route."""

    def __init__(self, back: dict, wide: dict, adj: dict, best: float, dist: dict,
                 targets: list):
        self.links = {}
        stack = list(targets)
        while stack:
            v = stack.pop()
            if v not in self.links:
                self.links[v] = [u for u in back[v]
                                 if wide[u] >= best and adj[u][v]["bandwidth"] >= best]
                stack.extend(self.links[v])
        self.order = sorted(self.links, key=dist.__getitem__)
        self.ends = {v for v in self.order if not back[v]}
        self.count = {}
        for v in self.order:
            self.count[v] = 1 if v in self.ends else sum(self.count[u] for u in self.links[v])
        self._memo: dict | None = None

    def of(self, v) -> list[list]:
        if self._memo is None:
            self._memo = {}
            for node in self.order:
                self._memo[node] = [[node]] if node in self.ends else [
                    [node, *chain] for u in self.links[node] for chain in self._memo[u]]
        return self._memo[v]
