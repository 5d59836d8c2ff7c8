"""Collectives over the flow network, against independent truths: the alpha-beta closed
forms and nccl-tests bus-bandwidth factors (doc/PERFORMANCE.md), link capacities, and the
CLI as a user runs it. (NCCL's own algorithms, protocols and tuner on CUDA GPUs:
tests/test_nccl_collectives.py.)

Single-node oracle: every GPU hangs off one switch, so GPU->GPU = 2 edges:
alpha = 2 * edge latency, B = per-GPU link bandwidth (per direction). Its GPUs are MI300X,
which NCCL's model does not cover, so the alpha-beta algorithms run at line rate there.
Clusters of DGX H100 run at the achievable rates (sim.link_capacity): NIC = 48 GB/s per
400 Gb/s NIC (NCCL's maintainers), NVLINK = 18 x 20.6 GB/s (NCCL's SM90 figure), and their
ring is NCCL's, with NCCL's latency (ring_latency below, from NCCL 2.30.7's tables).
"""
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.ops import Op, OpKind
from clustersim.sim.collective_algorithms import double_binary_tree, tree_depth
from clustersim.sim.cli.collective_report import parse_size, sweep_sizes
from clustersim.sim.collectives import (AUTOMATIC, Collective, collective_phases,
                                        parse_collective, run_collective, simulate_collective)
from clustersim.sim.flows import FlowNetwork
from clustersim.sim.gantt import hover_text
from clustersim.topologies import fat_tree, gpu_nodes, load_topology, path_latency, route, single_node

ROOT = Path(__file__).resolve().parent.parent
B, LAT = 100e9, 1e-6
ALPHA = 2 * LAT
NIC = 48e9  # an NDR port's achievable bytes/s per direction (sim.link_capacity)
NVLINK = 18 * 20.6e9  # an H100's achievable NVLink, bytes/s per direction
SIZES = [8, 1 << 20, 1 << 30]


def node(n):
    return single_node("mi300x", num_gpus=n, bandwidth=B, latency=LAT)


# --- uncontended closed forms on one NVSwitch node ---------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("size", SIZES)
def test_ring_all_reduce_closed_form(n, size):
    r = simulate_collective("all-reduce", size, n, node(n), "ring")
    assert r.time_s == pytest.approx(2 * (n - 1) * ALPHA + 2 * (n - 1) / n * size / B, rel=1e-9)
    assert r.steps == 2 * (n - 1) and r.flows == n
    assert r.algbw == pytest.approx(size / r.time_s)
    assert r.busbw == pytest.approx(r.algbw * 2 * (n - 1) / n)


@pytest.mark.parametrize("op", ["all-gather", "reduce-scatter"])
@pytest.mark.parametrize("n", [2, 5, 8])
@pytest.mark.parametrize("size", SIZES)
def test_ring_all_gather_reduce_scatter_closed_form(op, n, size):
    r = simulate_collective(op, size, n, node(n), "ring")
    assert r.time_s == pytest.approx((n - 1) * ALPHA + (n - 1) / n * size / B, rel=1e-9)
    assert r.busbw == pytest.approx(r.algbw * (n - 1) / n)


@pytest.mark.parametrize("op", ["all-reduce", "all-gather", "reduce-scatter", "all-to-all"])
def test_busbw_approaches_link_bandwidth_for_large_sizes(op):
    r = simulate_collective(op, 64 << 30, 8, node(8))
    assert r.busbw == pytest.approx(B, rel=1e-3) and r.busbw < B


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32])
def test_tree_all_reduce_closed_form(n):
    """Double binary tree, n a power of two: a rank inner in one tree (two children) is a
    leaf in the other, so its uplink carries S/2 up + 2 * S/2 down + S/2 up = 2S (n = 2:
    S), and the pipelined reduce+broadcast pays 2*log2(n) latencies."""
    size = 1 << 30
    r = simulate_collective("all-reduce", size, n, node(n), "tree")
    heaviest = size if n == 2 else 2 * size
    assert r.steps == 2 * int(math.log2(n))
    assert r.time_s == pytest.approx(r.steps * ALPHA + heaviest / B, rel=1e-9)


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8, 12, 16, 33, 64])
def test_tree_latency_term_scales_with_log2_n_and_ring_with_n(n):
    tiny = 1  # byte: the bandwidth term is ~1e-11 s
    tree = simulate_collective("all-reduce", tiny, n, node(n), "tree")
    ring = simulate_collective("all-reduce", tiny, n, node(n), "ring")
    assert tree.time_s == pytest.approx(2 * math.ceil(math.log2(n)) * ALPHA, rel=1e-4)
    assert ring.time_s == pytest.approx(2 * (n - 1) * ALPHA, rel=1e-4)


@pytest.mark.parametrize("n", list(range(2, 40)) + [100, 1000])
def test_double_binary_tree_shape(n):
    """Both trees span all ranks, depth ceil(log2 n); for even n no rank is inner in both."""
    trees = double_binary_tree(n)
    for parents in trees:
        assert parents.count(-1) == 1
        assert tree_depth(parents) == math.ceil(math.log2(n))
    inner = [{p for p in parents if p >= 0} for parents in trees]
    if n % 2 == 0:
        assert not inner[0] & inner[1]


@pytest.mark.parametrize("n", [2, 3, 8, 9])
def test_broadcast_closed_forms(n):
    size = 1 << 30
    ring = simulate_collective("broadcast", size, n, node(n), "ring")
    tree = simulate_collective("broadcast", size, n, node(n), "tree")
    assert ring.time_s == pytest.approx((n - 1) * ALPHA + size / B, rel=1e-9)
    depth = math.ceil(math.log2(n - 1)) if n > 2 else 0
    assert tree.time_s == pytest.approx((1 + depth) * ALPHA + size / B, rel=1e-9)
    assert ring.busbw == pytest.approx(ring.algbw)


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
def test_default_broadcast_and_reduce_are_rings_as_nccl_runs_them(op):
    """At 8 bytes on 8 GPUs the tree broadcast's estimate, 4 latencies, beats the ring's 7,
    yet NCCL runs both as rings (src/device/broadcast.h, reduce.h): so does the default."""
    tree = simulate_collective("broadcast", 8, 8, node(8), "tree")
    chosen = simulate_collective(op, 8, 8, node(8))
    assert chosen.algorithm == "ring" and chosen.time_s > tree.time_s


@pytest.mark.parametrize("n", [2, 3, 8, 9])
@pytest.mark.parametrize("size", SIZES)
def test_reduce_closed_form(n, size):
    """NCCL's reduce is a pipelined chain into the root (ring only, src/device/reduce.h):
    (n-1) latencies and S over the slowest hop; nccl-tests' busbw factor for reduce is 1."""
    r = simulate_collective("reduce", size, n, node(n))
    assert r.algorithm == "ring" and r.steps == n - 1 and r.flows == n - 1
    assert r.time_s == pytest.approx((n - 1) * ALPHA + size / B, rel=1e-9)
    assert r.busbw == pytest.approx(r.algbw)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_to_all_and_p2p_closed_forms(n):
    size = 1 << 30
    a2a = simulate_collective("all-to-all", size, n, node(n))
    assert (a2a.algorithm, a2a.flows) == ("direct", n * (n - 1))
    assert a2a.time_s == pytest.approx(ALPHA + (n - 1) / n * size / B, rel=1e-9)
    p2p = simulate_collective("p2p", size, 2, node(n))
    assert p2p.time_s == pytest.approx(ALPHA + size / B, rel=1e-9)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("per_peer, protocol, latency_us, share", [
    (8, "LL", 6.6 + 0.6, 0.5), (16384, "LL", 6.6 + 0.6, 0.5),
    (16385, "Simple", 8.4 + 3.4, 1.0), (1 << 27, "Simple", 8.4 + 3.4, 1.0)])
def test_nccl_all_to_all_and_p2p_on_one_nvswitch_node(n, per_peer, protocol, latency_us,
                                                      share):
    """NCCL runs all-to-all as a send/recv to every peer, with LL up to its P2P LL threshold
    of 16 KiB per peer and Simple above (src/enqueue.cc); it has no latency model of
    send/recv, and the one assumed is its tuning tables' one-hop ring latency (baseLat +
    NVLink hwLat: LL 6.6 + 0.6 us, Simple 8.4 + 3.4 us). LL moves 4 bytes of data per
    8-byte line. So on an NVSwitch node, where each GPU's (n-1)/n x S leave through its
    own NVLink: t = latency + (n-1)/n x S / (share x NVLink); a p2p of S: latency +
    S / (share x NVLink)."""
    graph = load_topology("dgx-h100")
    a2a = simulate_collective("all-to-all", per_peer * n, n, graph)
    assert (a2a.algorithm, a2a.flows, a2a.steps) == (f"direct/{protocol}", n * (n - 1), 0)
    assert a2a.latency_s == pytest.approx(latency_us * 1e-6, rel=1e-12)
    assert a2a.time_s == pytest.approx(
        latency_us * 1e-6 + (n - 1) * per_peer / (share * NVLINK), rel=1e-9)
    p2p = simulate_collective("p2p", per_peer, 2, graph)
    assert p2p.algorithm == f"direct/{protocol}"
    assert p2p.time_s == pytest.approx(latency_us * 1e-6 + per_peer / (share * NVLINK),
                                       rel=1e-9)


def test_a_reported_send_recv_choice_runs_again_and_other_protocols_are_refused():
    """A replay hands the reported choice ('direct/Simple') back for the next run of the
    same all-to-all (an expert-parallel group across nodes once failed on it); a protocol
    NCCL would not pick for send/recv at that size is refused, naming the threshold."""
    graph = load_topology("dgx-h100-x16-ndr")
    gpus = gpu_nodes(graph)[:16]
    name, phases = collective_phases("all-to-all", gpus, 1 << 26, graph)
    assert name == "direct/Simple"
    assert collective_phases("all-to-all", gpus, 1 << 26, graph, name)[1][0].latency == \
        phases[0].latency
    with pytest.raises(ConfigError, match="NCCL sends all-to-all with Simple at 4.194"):
        collective_phases("all-to-all", gpus, 1 << 26, graph, "direct/LL")


def test_all_to_all_latency_across_nodes_and_on_pcie():
    """Across nodes the hop is the network's (NCCL's hwLat NET ring: LL 2.7 us, Simple
    14.0); on a PCIe host without NVLink, PCI's (LL 1.0, Simple 5.7)."""
    fabric = load_topology("dgx-h100-x16-ndr")
    small = simulate_collective("all-to-all", 1024, 16, fabric)
    assert small.algorithm == "direct/LL"
    assert small.latency_s == pytest.approx((6.6 + 2.7) * 1e-6, rel=1e-12)
    pcie = simulate_collective("all-to-all", 1 << 30, 8, load_topology("pcie-a100"))
    assert pcie.algorithm == "direct/Simple"
    assert pcie.latency_s == pytest.approx((8.4 + 5.7) * 1e-6, rel=1e-12)


# --- algorithm choice and errors -----------------------------------------------------------------
@pytest.mark.parametrize("size", [8, 1 << 20, 16 << 20, 64 << 20, 1 << 30])
def test_default_all_reduce_is_the_faster_closed_form(size):
    n = 8
    ring = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * size / B
    tree = 2 * 3 * ALPHA + 2 * size / B
    r = simulate_collective("all-reduce", size, n, node(n))
    assert r.algorithm == ("ring" if ring < tree else "tree")
    assert r.time_s == pytest.approx(min(ring, tree), rel=1e-9)


@pytest.mark.parametrize("op", ["all-reduce", "all-gather", "reduce-scatter", "broadcast"])
@pytest.mark.parametrize("size", [8, 1 << 16, 1 << 22, 1 << 30])
def test_default_is_the_fastest_applicable_algorithm_without_nccl(op, size):
    graph = fat_tree("mi300x-8", num_nodes=4)
    times = {name: simulate_collective(op, size, 32, graph, name).time_s
             for name in AUTOMATIC[parse_collective(op)]}
    chosen = simulate_collective(op, size, 32, graph)
    assert chosen.time_s == pytest.approx(min(times.values()), rel=1e-9)


def test_large_all_reduce_across_four_hosts_takes_nccls_ring():
    """NCCL's tuner on 4 DGX H100: ring Simple's 8 x 48 GB/s beats NVLS-tree's per-channel
    ceiling of 45.5 GB/s (perChMaxNVLSTreeBw, Hopper, > 2 nodes) at 1 GiB."""
    r = simulate_collective("all-reduce", 1 << 30, 32, fat_tree("dgx-h100", num_nodes=4))
    assert r.algorithm == "ring/Simple"


@pytest.mark.parametrize("op, algorithm, words", [
    ("all-to-all", "tree", ["algorithm='tree'", "all-to-all", "direct"]),
    ("all-gather", "tree", ["algorithm='tree'", "all-gather", "ring"]),
    ("all-reduce", "bogus", ["algorithm must be one of", "ring"]),
    ("all-reduce", "hierarchical", ["algorithm='hierarchical'", "2 hosts"]),
    ("all-gather", "multi-ring", ["algorithm='multi-ring'", "2 hosts"]),
])
def test_inapplicable_algorithm_is_a_config_error(op, algorithm, words):
    with pytest.raises(ConfigError) as err:
        simulate_collective(op, 1 << 20, 8, node(8), algorithm)
    assert all(w in str(err.value) for w in words)


def test_hierarchical_needs_equal_ranks_per_host():
    with pytest.raises(ConfigError, match="same number"):
        simulate_collective("all-reduce", 1 << 20, 12, fat_tree("dgx-h100", num_nodes=2),
                            "hierarchical")


@pytest.mark.parametrize("ranks, words", [(9, "exceeds the 8 GPUs"), (1, ">= 2")])
def test_bad_rank_counts(ranks, words):
    with pytest.raises(ConfigError, match=words):
        simulate_collective("all-reduce", 1 << 20, ranks, "dgx-h100")


def test_schedule_op_kinds_map_to_their_collectives():
    assert {k: parse_collective(k).value for k in (
        OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.ALL_TO_ALL,
        OpKind.SEND_F)} == {OpKind.ALL_REDUCE: "all-reduce", OpKind.ALL_GATHER: "all-gather",
                            OpKind.REDUCE_SCATTER: "reduce-scatter",
                            OpKind.ALL_TO_ALL: "all-to-all", OpKind.SEND_F: "p2p"}


@pytest.mark.parametrize("name", ["all-reduce", "allreduce", "all_reduce", "ALL_REDUCE",
                                  OpKind.ALL_REDUCE])
def test_op_spellings(name):
    assert collective_phases(name, ["gpu0", "gpu1"], 8, node(2), "ring")[0] == "ring"
    with pytest.raises(ConfigError, match="collective op must be one of"):
        collective_phases("allsum", ["gpu0", "gpu1"], 8, node(2))


# --- contention ----------------------------------------------------------------------------------
def test_two_flows_through_one_link_each_get_half():
    env = simpy.Environment()
    net = FlowNetwork(env, node(4))
    into_gpu2 = net.link_index[("nvswitch0", "gpu2")]
    net.start_flows([(net.path_links("gpu0", "gpu2"), 1e9), (net.path_links("gpu1", "gpu2"), 1e9)])
    env.run(until=1e-6)
    assert net.link_load()[into_gpu2] == pytest.approx(B)
    assert net.rates_on(into_gpu2) == pytest.approx([B / 2, B / 2])
    env.run()
    assert env.now == pytest.approx(2e9 / B)


def test_a_flow_outlives_an_unrelated_shorter_one():
    """Regression (sim/flows.py): when the first flow finished, its links carried nothing
    else, and the timer for the other flow's finish was never re-armed."""
    env = simpy.Environment()
    net = FlowNetwork(env, node(4))
    short = net.start_flows([(net.path_links("gpu0", "gpu1"), 1e9)])
    long = net.start_flows([(net.path_links("gpu2", "gpu3"), 2e9)])
    env.run()
    assert short.triggered and long.triggered and env.now == pytest.approx(2e9 / B)


def test_flows_of_different_pairs_spread_over_the_spines():
    """Regression (sim/flows.py): per-pair round-robin sent every pair's first flow over
    spine0. Eight flows from leaf0 to leaf1 of a non-blocking fat-tree (8 spines) must
    each get a whole NIC's bandwidth."""
    graph = fat_tree("dgx-h100", num_nodes=2, nodes_per_leaf=1)
    env = simpy.Environment()
    net = FlowNetwork(env, graph)
    net.start_flows([(net.path_links(f"gpu{i}", f"gpu{8 + i}"), 1e9) for i in range(8)])
    env.run()
    assert env.now == pytest.approx(1e9 / NIC)


def test_concurrent_collectives_share_the_links():
    """Two all-reduces on the same 8 GPUs at once: each ring link carries two flows, so
    each takes twice the bandwidth term (contention from the network, not a formula)."""
    size, n = 1 << 30, 8
    env = simpy.Environment()
    net = FlowNetwork(env, node(n))
    spans = []
    gpus = gpu_nodes(net.graph)
    ops = [Op(OpKind.ALL_REDUCE, s, group="dp", nbytes=size) for s in (0, 1)]
    events = [run_collective(env, net, op, gpus, algorithm="ring", spans=spans) for op in ops]
    env.run()
    bandwidth_term = 2 * (n - 1) / n * size / B
    for ev in events:
        assert ev.value.time_s == pytest.approx(2 * (n - 1) * ALPHA + 2 * bandwidth_term)
    assert {s.lane for s in spans} == {"dp"} and len(spans) == 2 * n
    assert {s.op for s in spans} == set(ops)


def ring_latency(n, h, steps):
    """NCCL's latency of a ring Simple across h hosts of n ranks (us -> s): baseLat 8.4 +
    (steps - inter) x max(NVLink hwLat 3.4, Intel net overhead 1 x 3) + inter x net hwLat
    14, inter = 2(h-1) for an all-reduce; x1.4 once its chunks reach 64 B (the plateau)."""
    inter = 2 * (h - 1)
    return (8.4 + (steps - inter) * 3.4 + inter * 14.0) * 1.4 * 1e-6


def _hierarchical_all_reduce(graph, size, g, h):
    """Closed form: intra-host reduce-scatter + inter-host rings on S/g + all-gather."""
    nv, nic = NVLINK, NIC
    alpha_nv = path_latency(graph, route(graph, "gpu0", "gpu1"))
    alpha_net = max(path_latency(graph, route(graph, "gpu0", f"gpu{g * k}")) for k in range(h))
    intra = (g - 1) * alpha_nv + (g - 1) / g * size / nv
    return 2 * intra + 2 * (h - 1) * alpha_net + 2 * (h - 1) / h * size / g / nic, alpha_net


def test_oversubscribed_fat_tree_halves_the_cross_leaf_bandwidth_term():
    """One node per leaf, so every inter-host flow crosses leaves. The hierarchical
    all-reduce's inter-host phase runs 8 rail rings at once: each leaf sends 8 flows up.
    Non-blocking: 8 spine uplinks of 50 GB/s, one flow each, NIC-bound. 2:1: 4 uplinks of
    50 GB/s, two flows each, 25 GB/s: that phase's bandwidth term doubles, the intra-host
    phases and the latencies are unchanged."""
    size, h, g = 1 << 30, 4, 8
    full = fat_tree("dgx-h100", num_nodes=h, nodes_per_leaf=1)
    half = fat_tree("dgx-h100", num_nodes=h, nodes_per_leaf=1, oversubscription=2)
    t_full = simulate_collective("all-reduce", size, h * g, full, "hierarchical").time_s
    t_half = simulate_collective("all-reduce", size, h * g, half, "hierarchical").time_s
    expected, _ = _hierarchical_all_reduce(full, size, g, h)
    inter_bandwidth_term = 2 * (h - 1) / h * size / g / NIC
    assert t_full == pytest.approx(expected, rel=1e-9)
    assert t_half - t_full == pytest.approx(inter_bandwidth_term, rel=1e-6)


def test_multi_ring_all_reduce_is_nic_bound_with_every_nic_busy():
    """g rings on S/g each (NCCL's ring channels); ring j leaves every host through a
    different GPU, so each GPU's NIC carries one ring's flow: 2(n-1)/n * S/g at 48 GB/s,
    slower than the g-1 NVLink flows sharing 370.8 GB/s; the latency is NCCL's ring's."""
    size, h, g = 1 << 30, 4, 8
    n = h * g
    graph = fat_tree("dgx-h100", num_nodes=h, nodes_per_leaf=1)
    r = simulate_collective("all-reduce", size, n, graph, "multi-ring", "Simple")
    assert r.time_s == pytest.approx(ring_latency(n, h, 2 * (n - 1))
                                     + 2 * (n - 1) / n * size / g / NIC, rel=1e-9)
    _, (phase,) = collective_phases("all-reduce", gpu_nodes(graph), size, graph, "multi-ring")
    host = {gpu: graph.nodes[gpu]["host"] for gpu in gpu_nodes(graph)}
    leaving = [src for src, dst, _ in phase.flows if host[src] != host[dst]]
    assert sorted(leaving) == sorted(gpu_nodes(graph))  # every GPU's NIC, once


def test_hierarchical_all_gather_and_reduce_scatter_closed_form():
    size, h, g = 1 << 30, 4, 8
    n = h * g
    graph = fat_tree("dgx-h100", num_nodes=h, nodes_per_leaf=1)
    _, alpha_net = _hierarchical_all_reduce(graph, size, g, h)
    intra = (g - 1) * ALPHA + (g - 1) / g * size / NVLINK
    ag = simulate_collective("all-gather", size, n, graph, "hierarchical")
    rs = simulate_collective("reduce-scatter", size, n, graph, "hierarchical")
    assert ag.time_s == pytest.approx(intra + (h - 1) * alpha_net + (h - 1) * size / n / NIC)
    assert rs.time_s == pytest.approx(intra + (h - 1) * alpha_net + (h - 1) / h * size / g / NIC)


def test_all_to_all_across_hosts_is_bounded_by_the_nics():
    """Each GPU sends S/n to each of the n-g GPUs on other hosts, all through its own NIC
    (GPUs do not relay), so t >= (n-g)/n * S / B_nic and busbw = S/t * (n-1)/n <=
    B_nic * (n-1)/(n-g). On a non-blocking fabric the NIC is the bottleneck, so the time
    is that bound plus one latency (the intra-host flows finish earlier over NVLink): the
    send/recv latency assumed for NCCL across nodes with Simple (32 MiB per peer), NCCL
    2.30.7's baseLat ring Simple 8.4 us + hwLat NET ring Simple 14.0 us."""
    size, h, g = 1 << 30, 4, 8
    n = h * g
    graph = fat_tree("dgx-h100", num_nodes=h, nodes_per_leaf=1)
    r = simulate_collective("all-to-all", size, n, graph)
    assert r.algorithm == "direct/Simple"
    assert r.time_s == pytest.approx((8.4 + 14.0) * 1e-6 + (n - g) / n * size / NIC, rel=1e-9)
    assert r.busbw <= NIC * (n - 1) / (n - g)
    assert r.busbw == pytest.approx(NIC * (n - 1) / (n - g), rel=2e-3)  # latency: 0.13% of t


def test_1024_gpu_ring_all_reduce_is_fast_and_exact():
    graph = load_topology("dgx-h100-x128-ndr-ft")
    size, n = 1 << 30, 1024
    start = time.perf_counter()
    r = simulate_collective("all-reduce", size, n, graph, "ring", "Simple")
    wall = time.perf_counter() - start
    # NCCL's ring: 8 channels, each leaving every host through its own NIC
    assert r.time_s == pytest.approx(ring_latency(n, 128, 2 * (n - 1))
                                     + 2 * (n - 1) / n * size / 8 / NIC, rel=1e-9)
    assert wall < 2.0  # target 0.5 s (benchmarks/collectives.py); slack for loaded CI


# --- properties --------------------------------------------------------------------------------
SMALL_FAT_TREE = fat_tree("dgx-h100", num_nodes=4, nodes_per_leaf=2, oversubscription=2)
GPUS = gpu_nodes(SMALL_FAT_TREE)

flow_sets = st.lists(st.tuples(
    st.sampled_from(GPUS), st.sampled_from(GPUS), st.floats(1e3, 1e9), st.floats(0, 1e-2)),
    min_size=1, max_size=25).map(lambda fs: [f for f in fs if f[0] != f[1]])


@settings(max_examples=60, deadline=None)
@given(flow_sets)
def test_random_flows_respect_capacity_deliver_their_bytes_and_finish(flows):
    """Rates only change at events, so stepping SimPy event by event and reading the link
    loads after each instant gives the exact load curve: no link ever exceeds its capacity,
    and the integral of all link loads equals each flow's bytes times its hop count."""
    env = simpy.Environment()
    net = FlowNetwork(env, SMALL_FAT_TREE)
    done, expected = [], 0.0
    for src, dst, nbytes, start in flows:
        links = net.path_links(src, dst)
        done.append(net.start_flows([(links, nbytes)], delay=start))
        expected += nbytes * len(links)
    delivered, last, load = 0.0, 0.0, net.link_load()  # flows with no delay started now
    while env.peek() < math.inf:
        env.step()
        if env.peek() > env.now:  # every event of this instant processed
            delivered += sum(load.values()) * (env.now - last)
            last, load = env.now, net.link_load()
            for link, rate in load.items():
                assert rate <= net.capacity[link] * (1 + 1e-9)
    assert all(ev.triggered for ev in done)
    assert net.completed_flows == len(flows) and not net.link_load()
    assert delivered == pytest.approx(expected, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([c for c in Collective if c is not Collective.P2P]),
       st.integers(2, len(GPUS)), st.integers(1, 1 << 32))
def test_a_collective_has_one_span_per_member(op, n, size):
    r = simulate_collective(op, size, n, SMALL_FAT_TREE)
    spans = r.timeline.spans
    assert sorted(s.rank for s in spans) == list(range(n))
    assert all(s.start == 0 and s.end == pytest.approx(r.time_s) for s in spans)
    assert all(s.lane == "coll" and s.info["algorithm"] == r.algorithm for s in spans)


def test_spans_show_algorithm_bytes_and_busbw_in_the_gantt_hover():
    r = simulate_collective("all-reduce", 1 << 30, 8, node(8))
    text = hover_text(r.timeline.spans[0])
    assert "algorithm: ring" in text and "busbw_GBps" in text and "bytes: 1.07 GB" in text


# --- sizes and the CLI ---------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [
    ("8", 8), ("8K", 8192), ("256M", 256 << 20), ("1G", 1 << 30), ("1g", 1 << 30),
    ("1GiB", 1 << 30), ("1GB", 10**9), ("1kB", 1000), ("1.5K", 1536), ("1e9", 10**9)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1X", "0", "1.5", "-8"])
def test_parse_size_rejects(text):
    with pytest.raises(ConfigError, match="--size"):
        parse_size(text)


def test_sweep_sizes_are_nccl_tests_doublings():
    assert sweep_sizes(8, 64, 2) == [8, 16, 32, 64]


def clustersim(*args):
    return subprocess.run([sys.executable, "-m", "clustersim", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_cli_json_busbw_is_nvls_minus_the_latency_effect():
    out = clustersim("collective", "all-reduce", "--size", "1G", "--ranks", "8",
                     "--topology", "dgx-h100", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    size, n = 1 << 30, 8
    # NCCL's choice on one DGX H100 at 1 GiB: NVLS, 25 us, then S(1 + 1/n) through each
    # GPU's NVLink at 0.85 of it (nvlsEfficiency)
    t = 25e-6 + size * (1 + 1 / n) / (NVLINK * 0.85)
    assert data["algorithm"] == "nvls/Simple" and data["size_bytes"] == size
    assert data["busbw_GBps"] == pytest.approx(size / t * 2 * (n - 1) / n / 1e9, rel=1e-9)
    assert 470 < data["busbw_GBps"] < 490


def test_cli_sweep_prints_the_nccl_tests_table():
    out = clustersim("collective", "allreduce", "--sweep", "--min-size", "8", "--max-size",
                     "1M", "--topology", "dgx-h100")
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [8 << k for k in range(18)]
    assert rows[0][1:3] == ["2", "float"]
    assert "busbw" in out.stdout and "Avg bus bandwidth" in out.stdout


def test_sweep_count_is_the_one_nccl_tests_prints():
    """nccl-tests' count column is its paramcount: the whole buffer for all-reduce, one
    rank's part for all-gather and reduce-scatter ((count / 4n) x 4), one peer's for
    all-to-all (count / n, down to 16 bytes' elements). 1 MiB of float on 8 ranks:
    262144, 32768, 32768, 32768; of half on 8 ranks for all-to-all: 65536."""
    from clustersim.sim.cli.collective_report import nccl_tests_count
    mib = 1 << 20
    assert nccl_tests_count("all-reduce", mib, 4, 8) == 262144
    for op in ("all-gather", "reduce-scatter", "all-to-all"):
        assert nccl_tests_count(op, mib, 4, 8) == 32768
    assert nccl_tests_count("all-to-all", mib, 2, 8) == 65536
    assert nccl_tests_count("all-gather", 100, 4, 8) == 0  # below one aligned element each
    assert nccl_tests_count("all-to-all", 8 * 4 * 5, 4, 8) == 4  # 5 floats, to 4 (16 B)
    out = clustersim("collective", "all-gather", "--sweep", "--min-size", "1M", "--max-size",
                     "1M", "--ranks", "8", "--topology", "dgx-h100")
    row = [line.split() for line in out.stdout.splitlines() if not line.startswith("#")][0]
    assert row[:3] == ["1048576", "32768", "float"]


@pytest.mark.parametrize("args, words", [
    (["all-sum", "--size", "1G"], "collective op must be one of"),
    (["all-reduce", "--size", "1Q"], "--size"),
    (["all-reduce", "--size", "1G", "--ranks", "64"], "exceeds"),
    (["all-to-all", "--size", "1G", "--algorithm", "ring"], "does not apply"),
])
def test_cli_errors_are_one_line_exit_2(args, words):
    out = clustersim("collective", *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clustersim: error:") and words in lines[0]


def test_kept_phases_are_the_computed_ones_and_bounded(monkeypatch):
    """collective_phases keeps what it computed per graph (a replay asks again and again):
    a second call returns the kept result, which equals a fresh computation on a copy of
    the graph; the flows kept never exceed KEPT_FLOWS, however many sizes are asked."""
    from clustersim.sim import collectives
    graph = load_topology("dgx-h100-x16-ndr")
    gpus = gpu_nodes(graph)[:16]
    monkeypatch.setattr(collectives, "KEPT_FLOWS", 300)
    for size in SIZES * 2:
        for op in ("all-reduce", "all-gather", "all-to-all"):
            got = collective_phases(op, gpus, size, graph)
            assert collective_phases(op, gpus, size, graph) is got
            fresh = collective_phases(op, gpus, size, graph.copy())
            assert got[0] == fresh[0] and [(p.steps, p.flows, p.latency) for p in got[1]] == [
                (p.steps, p.flows, p.latency) for p in fresh[1]]
            kept_flows, kept = collectives._KEPT[graph]
            assert kept_flows <= 300 and kept_flows == sum(
                len(p.flows) for _, phases in kept.values() for p in phases)
    before = dict(collectives._KEPT[graph][1])
    big = collective_phases("all-to-all", gpu_nodes(graph)[:32], SIZES[0], graph)
    assert sum(len(p.flows) for p in big[1]) > 300  # too large to keep: the others stay
    assert collectives._KEPT[graph][1] == before


def test_an_nccl_run_reports_the_latency_it_paid_not_ring_steps():
    """Under NCCL's model a phase waits NCCL's latency of its algorithm and protocol, not
    route-latency steps: the result reports that latency and no steps (a 16-GPU tree
    all-reduce once printed a ring's 2(n-1) = 30 steps). An 8-byte all-reduce is all
    latency: its time is the reported latency."""
    topology = load_topology("dgx-h100-x16-ndr")
    tiny = simulate_collective("all-reduce", 8, 16, topology)
    row = tiny.to_dict()
    assert tiny.algorithm.startswith("tree/") and row["steps"] == 0
    assert row["nccl_latency_us"] == pytest.approx(row["time_us"], rel=1e-3)
    ring = simulate_collective("all-reduce", 8, 16, topology, "ring").to_dict()
    assert ring["steps"] == 0 and ring["nccl_latency_us"] > 0
    out = subprocess.run([sys.executable, "-m", "clustersim", "collective", "all-reduce",
                          "--size", "8", "--ranks", "16", "--topology", "dgx-h100-x16-ndr"],
                         capture_output=True, text=True, check=True).stdout
    assert "(NCCL's model)" in out and "steps" not in out
