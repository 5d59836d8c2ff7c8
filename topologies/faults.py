"""Slow and failed links: a topology with some links degraded or removed, for what-if runs.

A link selector names one link, `a:b` (both directions between nodes a and b), or every
link of one node, `a` (its NIC, its NVLink port, a switch). `degrade(graph, selector,
factor)` multiplies the selected links' bandwidth by `factor` (0 < factor <= 1: a NIC
negotiated down from 400 to 200 Gb/s is 0.5); `fail(graph, selector)` removes them, and
routes (topologies.routing) then use what remains, as ECMP does once a link is down. A
failure that leaves some GPU unable to reach another is refused, naming the GPU cut off.
Both return a new graph (the input is never changed) whose `faults` attribute lists what
was done, in words; the symmetric replay then refuses it (sim.symmetry) and the full
replay runs it. Units: bandwidth in bytes/s.
"""
from __future__ import annotations

import networkx as nx

from .errors import TopologyError
from .graph import gpu_nodes


def select_links(graph: nx.DiGraph, selector: str) -> list[tuple[str, str]]:
    """The directed edges a selector names (module docstring); TopologyError naming the
    selector when it names none."""
    a, sep, b = selector.partition(":")
    for node in (a, b) if sep else (a,):
        if node not in graph:
            raise TopologyError(f"link {selector!r}: no node {node!r} in topology "
                                f"{graph.graph.get('name', '')!r}")
    if sep:
        edges = [(u, v) for u, v in ((a, b), (b, a)) if graph.has_edge(u, v)]
        if not edges:
            raise TopologyError(f"link {selector!r}: {a} and {b} are not linked")
        return edges
    return list(graph.out_edges(a)) + list(graph.in_edges(a))


def _faulted(graph: nx.DiGraph, note: str) -> nx.DiGraph:
    out = graph.copy()
    out.graph["faults"] = [*graph.graph.get("faults", ()), note]
    return out


def degrade(graph: nx.DiGraph, selector: str, factor: float) -> nx.DiGraph:
    """A copy with the selected links' bandwidth times `factor` (0 < factor < 1)."""
    if not 0 < factor < 1:
        raise TopologyError(f"link {selector!r}: factor {factor} must be in (0, 1) (the "
                            f"fraction of its bandwidth the link keeps; 1 would change "
                            f"nothing)")
    edges = select_links(graph, selector)
    out = _faulted(graph, f"link {selector} at {factor:g} of its bandwidth "
                          f"({len(edges)} directed edges)")
    for u, v in edges:
        out.edges[u, v]["bandwidth"] *= factor
    return out


def fail(graph: nx.DiGraph, selector: str) -> nx.DiGraph:
    """A copy without the selected links; refused when a GPU can no longer reach
    every other GPU."""
    edges = select_links(graph, selector)
    out = _faulted(graph, f"link {selector} failed ({len(edges)} directed edges removed)")
    out.remove_edges_from(edges)
    gpus = gpu_nodes(out)
    reach = nx.descendants(out, gpus[0])
    cut = next((g for g in gpus[1:] if g not in reach), None)
    if cut is None:
        back = nx.descendants(out.reverse(copy=False), gpus[0])
        cut = next((g for g in gpus[1:] if g not in back), None)
    if cut is not None:
        raise TopologyError(f"failing link {selector!r} cuts {cut} off from {gpus[0]}: no "
                            f"route is left (the job cannot run; fail a link with a "
                            f"redundant path, such as a leaf-spine uplink)")
    return out
