"""FlowNetwork: transfers as max-min fair flows, checked against hand-derived times."""
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.sim.flow_batch import ARRAY_FLOWS, FlowBatch, OneFlow
from clustersim.sim.flows import FlowNetwork, _PairRoutes
from clustersim.topologies import gpu_nodes, load_topology, single_node

BW, LAT = 100e9, 1e-6  # bytes/s per direction, seconds per hop
S = 1e9


def finish_times(transfers, delays=None):
    """Run transfers (src, dst, nbytes), started at `delays`, and return their end times."""
    env = simpy.Environment()
    # MI300X: no NCCL figure, so links run at the line rate BW (sim.link_capacity)
    net = FlowNetwork(env, single_node("mi300x", num_gpus=4, bandwidth=BW, latency=LAT))
    ends = [None] * len(transfers)

    def start(i, src, dst, nbytes, delay):
        yield env.timeout(delay)
        yield net.transfer(src, dst, nbytes)
        ends[i] = env.now

    for i, (src, dst, nbytes) in enumerate(transfers):
        env.process(start(i, src, dst, nbytes, (delays or [0] * len(transfers))[i]))
    env.run()
    return ends, net


def test_lone_transfer_is_latency_plus_bytes_over_bandwidth():
    (end,), _ = finish_times([("gpu0", "gpu1", S)])
    assert end == pytest.approx(2 * LAT + S / BW)


def test_two_flows_into_one_gpu_each_get_half_the_link():
    ends, _ = finish_times([("gpu0", "gpu2", S), ("gpu1", "gpu2", S)])
    assert ends == pytest.approx([2 * LAT + 2 * S / BW] * 2)


def test_disjoint_flows_do_not_interfere():
    ends, _ = finish_times([("gpu0", "gpu1", S), ("gpu2", "gpu3", S)])
    assert ends == pytest.approx([2 * LAT + S / BW] * 2)


def test_capacity_freed_by_a_finished_flow_goes_to_the_others():
    # Sharing at B/2 until the short flow has sent S (t = 2S/B); the long one then has
    # S left at the full B: it ends at 3S/B.
    ends, net = finish_times([("gpu0", "gpu2", S), ("gpu1", "gpu2", 2 * S)])
    assert ends == pytest.approx([2 * LAT + 2 * S / BW, 2 * LAT + 3 * S / BW])
    assert net.completed_flows == 2 and not net.link_load()


def test_late_flow_slows_a_running_one():
    # The first runs alone for 0.5 S/B (sends S/2), then shares: S/2 left at B/2 takes S/B.
    delay = 0.5 * S / BW
    ends, _ = finish_times([("gpu0", "gpu2", S), ("gpu1", "gpu2", S)], [0, delay])
    assert ends[0] == pytest.approx(2 * LAT + 1.5 * S / BW)
    # The second: S/2 during the shared second, then S/2 alone at B.
    assert ends[1] == pytest.approx(2 * LAT + 2.0 * S / BW)


def test_zero_bytes_cost_only_latency():
    (end,), _ = finish_times([("gpu0", "gpu3", 0)])
    assert end == pytest.approx(2 * LAT)


# Routes as a fat-tree gives them: shared first and last hops, k distinct middle links each.
route_sets = st.tuples(st.integers(2, 8), st.integers(1, 3), st.integers(0, 3)).flatmap(
    lambda nkt: st.tuples(
        st.just([(0, *range(10 + i * nkt[1], 10 + (i + 1) * nkt[1]), 1)
                 for i in range(nkt[0])]),
        st.lists(st.integers(0, 3), min_size=40, max_size=40), st.just(nkt[2])))


@settings(max_examples=200, deadline=None)
@given(route_sets)
def test_route_choice_is_the_least_loaded_in_round_robin_order(instance):
    """The choice, which sums only the links not all routes share, is the rule's: the
    fewest flows over all of a route's links, ties to the first from the pair's turn."""
    paths, routed, turns = instance
    pair, n = _PairRoutes(paths), len(paths)
    for turn in range(turns + 1):
        order = [paths[(turn + i) % n] for i in range(n)]
        expected = min(order, key=lambda path: sum(routed[l] for l in path))  # first minimum
        assert pair.least_loaded(routed) == expected


def test_a_large_coflow_ends_each_flow_as_lone_flows_would():
    """ARRAY_FLOWS or more flows started together are one FlowBatch of numpy arrays; the
    same flows on the same routes, started at the same instant one by one, are OneFlows of
    plain values. Max-min rates do not depend on how the flows are held: every flow ends
    at the same time both ways, and no link ever carries more than its capacity."""
    graph = load_topology("dgx-h100-x16-ndr")
    gpus = gpu_nodes(graph)
    pairs = [(gpus[i], gpus[(i + step) % len(gpus)]) for step in (37, 71) for i in range(128)]
    sizes = [1e8 * (1 + i % 5) for i in range(len(pairs))]
    assert len(pairs) >= ARRAY_FLOWS

    def run(together: bool) -> list[float]:
        env = simpy.Environment()
        net = FlowNetwork(env, graph)
        routes = net.paths_links(pairs)
        groups = ([net.coflow(routes, sizes)] if together
                  else [net.coflow([r], [s]) for r, s in zip(routes, sizes)])
        kinds = {type(part) for coflow in groups for part in coflow.parts}
        assert kinds == {FlowBatch if together else OneFlow}
        for coflow in groups:
            net.start(coflow)
        capacity, peak = net.capacity, 0.0
        while env.peek() < float("inf"):
            env.step()
            peak = max([peak] + [load / capacity[l] for l, load in net.link_load().items()])
        assert peak <= 1 + 1e-9 and net.completed_flows == len(pairs)
        return [ended for coflow in groups for _, _, ended in coflow.routes()]

    assert run(True) == pytest.approx(run(False), rel=1e-9)
