"""topologies.faults: degraded and failed links, checked against the routing rule and the
path bottleneck (closed forms on the preset's documented link speeds)."""
import pytest

from clustersim.topologies import load_topology
from clustersim.topologies.errors import TopologyError
from clustersim.topologies.faults import degrade, fail
from clustersim.topologies.route_sets import route_sets
from clustersim.topologies.routing import path_bandwidth, route, routes

NDR = 50e9  # bytes/s per direction of a 400 Gb/s NDR link (the preset's description)


@pytest.fixture(scope="module")
def rails():
    return load_topology("dgx-h100-x16-ndr")


def test_a_degraded_nic_halves_the_bottleneck_of_routes_through_it(rails):
    slow = degrade(rails, "nic0", 0.5)
    assert path_bandwidth(rails, route(rails, "gpu0", "gpu8")) == NDR
    assert path_bandwidth(slow, route(slow, "gpu0", "gpu8")) == NDR / 2
    assert path_bandwidth(slow, route(slow, "gpu1", "gpu9")) == NDR  # another rail
    assert rails.edges["nic0", "rail0"]["bandwidth"] == NDR  # the input is left alone
    assert slow.graph["faults"] == ["link nic0 at 0.5 of its bandwidth (4 directed edges)"]


def test_a_failed_nvlink_reroutes_over_pcie(rails):
    """gpu0 loses its NVSwitch port: to gpu1 on its own host the shortest path left runs
    through the host's PCIe root complex (2 hops, as NVLink's), at PCIe Gen5 x16 speed
    (the slowest of its two links)."""
    assert route(rails, "gpu0", "gpu1") == ["gpu0", "nvswitch0", "gpu1"]
    cut = fail(rails, "gpu0:nvswitch0")
    path = route(cut, "gpu0", "gpu1")
    assert path == ["gpu0", "host0", "gpu1"]
    assert {cut.edges[a, b]["kind"] for a, b in zip(path, path[1:])} == {"pcie"}
    assert path_bandwidth(cut, path) == min(cut.edges["gpu0", "host0"]["bandwidth"],
                                            cut.edges["host0", "gpu1"]["bandwidth"]) < NDR * 2


def test_a_failed_uplink_removes_its_equal_cost_paths(rails):
    """Rail 0 reaches rail 1 through each of the 8 spines; without rail0's link to spine0
    the other 7 remain."""
    before = routes(rails, "gpu0", "gpu9")
    after = routes(fail(rails, "rail0:spine0"), "gpu0", "gpu9")
    assert len(before) == 8 and len(after) == 7
    assert all("spine0" not in path for path in after)


@pytest.mark.parametrize("selector,factor,match", [
    ("nic999", 0.5, "link 'nic999': no node 'nic999'"),
    ("gpu0:gpu9", 0.5, "link 'gpu0:gpu9': gpu0 and gpu9 are not linked"),
    ("nic0", 0.0, "link 'nic0': factor 0.0 must be in \\(0, 1\\)"),
    ("nic0", 1.0, "link 'nic0': factor 1.0 must be in \\(0, 1\\) .*1 would change nothing"),
    ("nic0", 2.0, "link 'nic0': factor 2.0 must be in \\(0, 1\\)")])
def test_bad_link_selectors_and_factors_are_refused(rails, selector, factor, match):
    with pytest.raises(TopologyError, match=match):
        degrade(rails, selector, factor)


def test_a_failure_that_cuts_a_gpu_off_is_refused(rails):
    with pytest.raises(TopologyError, match="failing link 'gpu5' cuts gpu5 off from gpu0"):
        fail(rails, "gpu5")


@pytest.mark.parametrize("fault", [lambda g: fail(g, "rail0:spine0"),
                                   lambda g: degrade(g, "nic3", 0.5),
                                   lambda g: fail(g, "gpu0:nvswitch0"),
                                   lambda g: degrade(g, "spine1", 0.25)],
                         ids=["failed-uplink", "slow-nic", "failed-nvlink", "slow-spine"])
def test_composed_routes_stay_exact_on_a_faulted_fabric(rails, fault):
    """The flow network's composed routes (topologies.route_sets: prefix x middle x
    suffix, assuming every GPU's funnel is alike) equal the searched ones once a fault
    breaks that likeness."""
    graph = fault(rails)
    composed = route_sets(graph)
    for src, dst in [("gpu0", "gpu1"), ("gpu0", "gpu9"), ("gpu3", "gpu77"), ("gpu8", "gpu0"),
                     ("gpu24", "gpu19"), ("gpu127", "gpu64")]:
        assert composed.routes(src, dst) == routes(graph, src, dst), (src, dst)
