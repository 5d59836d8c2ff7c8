"""The builders' fast path, `topologies.nodes.add_parts` writing a DiGraph's dicts directly,
makes the graph networkx's own `add_node` / `add_edge` make: the same nodes, edges and
attributes in the same orders (link ids elsewhere are `enumerate(graph.edges)`)."""
import networkx as nx
import pytest

from clustersim.topologies import NODE_KINDS, add_host, clusters, list_presets, load_topology, nodes
from clustersim.topologies.clusters import fat_tree, fat_tree_3tier, rail_optimized
from clustersim.topologies.nodes import add_link


def _per_call(graph, parts, links):
    """What `add_parts` stands for, one networkx call at a time."""
    for node, attrs in parts:
        graph.add_node(node, **attrs)
    for a, b, attrs in links:
        add_link(graph, a, b, **attrs)


def _layout(g):
    return (g.graph, list(g.nodes(data=True)), list(g.edges(data=True)),
            [(n, list(g.pred[n])) for n in g])


def _both(monkeypatch, build):
    fast = build()
    with monkeypatch.context() as m:
        m.setattr(nodes, "add_parts", _per_call)
        m.setattr(clusters, "add_parts", _per_call)
        slow = build()
    return fast, slow


@pytest.mark.parametrize("preset", list_presets())
def test_presets_build_as_per_call(preset, monkeypatch):
    fast, slow = _both(monkeypatch, lambda: load_topology(preset))
    assert _layout(fast) == _layout(slow)


@pytest.mark.parametrize("build", [
    lambda: fat_tree("pcie-h100-nvl", 5, nodes_per_leaf=2, in_network_reduction=True),
    lambda: rail_optimized("mi300x-8", 9, nodes_per_group=2, num_spines=3, oversubscription=3.0),
    lambda: fat_tree_3tier("pcie-h100", 13, rails=True, nodes_per_pod=4, nodes_per_leaf=2,
                           leaf_oversubscription=2.0, pod_oversubscription=3.0),
    lambda: fat_tree_3tier("gb200-nvl72", 5, nodes_per_pod=2, nodes_per_leaf=1),
])
def test_builders_build_as_per_call(build, monkeypatch):
    fast, slow = _both(monkeypatch, build)
    assert _layout(fast) == _layout(slow)


@pytest.mark.parametrize("kind", sorted(NODE_KINDS))
def test_add_host_onto_existing_parts_updates_as_networkx_does(kind, monkeypatch):
    def build():
        g = nx.DiGraph(name="partial")
        g.add_node("host0", color="red")
        g.add_edge("gpu1", "host0", bandwidth=1.0, latency=0.0, kind="x", extra=3)
        add_host(g, kind, 0, 0, nics=True)
        add_host(g, kind, 0, 0, nics=True, pcie_latency=2e-6)  # every node and edge again
        return g
    fast, slow = _both(monkeypatch, build)
    assert _layout(fast) == _layout(slow)
    assert fast.edges["gpu1", "host0"]["extra"] == 3 and fast.nodes["host0"]["color"] == "red"


def test_every_edge_has_its_own_attribute_dict():
    g = fat_tree("dgx-h100", 3, nodes_per_leaf=2)
    assert all(g.succ[u][v] is g.pred[v][u] for u, v in g.edges)
    assert len({id(a) for _, _, a in g.edges(data=True)}) == g.number_of_edges()
    assert len({id(a) for _, a in g.nodes(data=True)}) == g.number_of_nodes()
