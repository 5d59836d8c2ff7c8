"""Issue 19's faster collectives changed no answer.

The numbers in RECORDED were the simulated outputs of the code at commit 13dc3f2, before
the restructuring (route sets composed per switch pair, the ECMP choice and the alpha-beta
estimate on link-id arrays, the flow table; then a phase's ECMP choices in numpy runs, GPU
pairs of one host read off the funnel search, the estimate's lower bounds, the compacted
max-min), and held to 1e-9 relative through all of it (up to commit 24d2dd7). Issue 22
then changed the model itself (NCCL's algorithms, protocols and latencies; links at their
achievable rates), so they were recorded again with each of its model changes (last:
the all-to-all's send/recv latency and protocol, sim.nccl_tuning.p2p_latency_us, which
changed only the all-to-all entries and what runs beside them): from there this test's
only purpose is to show that later restructurings change no answer.
Each cache or vectorised step is also checked against what it replaces,
independently of any recorded number (the tests after RECORDED). It is the one place that checks the
simulator against its own earlier output; the models themselves are checked against
closed forms in tests/test_collectives.py and tests/test_flows.py.

The cases: every algorithm of every collective on one NVSwitch node, on a PCIe host and on
a GPU mesh; 64-256 ranks of dgx-h100-x128-ndr-ft (32 equal-cost spine paths per cross-leaf
pair) and of its 2:1 oversubscribed twin, where ECMP flows contend on the uplinks; the
rail-optimised dgx-h100-x16-ndr; a three-tier SuperPOD; llama3-24k-roce across pods;
sweeps (a pair's second flow starts the ECMP round robin one route later); collectives
running together on one network; and the uncontended alpha-beta estimates.

Recorded (first on a git worktree of 13dc3f2 reached through a `clustersim` symlink, then
on issue 22's tree):
    PYTHONPATH=/tmp/cs_old_pkg python tests/test_fast_network.py --record
"""
from __future__ import annotations

import random
import sys
from collections import defaultdict
from functools import lru_cache

import networkx as nx
import numpy as np
import pytest
import simpy

from clustersim.schedules.errors import ConfigError
from clustersim.sim.collective_algorithms import estimate_lower_bound, estimate_time
from clustersim.sim.collectives import (AUTOMATIC, _fastest, collective_phases,
                                        parse_collective, run_collective, sweep_collective)
from clustersim.sim.ecmp import EcmpRoutes, _PairRoutes
from clustersim.sim.flows import FlowNetwork
from clustersim.sim.maxmin import max_min_rates
from clustersim.sim.route_shares import RouteShares
from clustersim.topologies import gpu_nodes, list_presets, load_topology, routes
from clustersim.topologies.route_sets import RouteSets, _sorted_distinct
from clustersim.topologies.routing import fewest_hop_paths

M, G = 1 << 20, 1 << 30

# name: (topology, op, ranks, sizes, algorithm)
SWEEPS = {
    "node-ar-ring": ("dgx-h100", "all-reduce", 8, [64 * M], "ring"),
    "node-ar-tree": ("dgx-h100", "all-reduce", 8, [4 * M], "tree"),
    "node-ag": ("dgx-h100", "all-gather", 8, [G], None),
    "node-rs": ("dgx-h100", "reduce-scatter", 8, [G], None),
    "node-a2a": ("dgx-h100", "all-to-all", 8, [G], None),
    "node-bcast-tree": ("dgx-h100", "broadcast", 7, [G], "tree"),
    "node-reduce": ("dgx-h100", "reduce", 8, [G], None),
    "pcie-ar": ("pcie-a100", "all-reduce", 8, [256 * M], None),
    "pcie-a2a": ("pcie-a100", "all-to-all", 8, [256 * M], None),
    "mesh-ar-ring": ("mi300x-8", "all-reduce", 8, [256 * M], "ring"),
    "mesh-a2a": ("mi300x-8", "all-to-all", 8, [256 * M], None),
    "ft-a2a-64": ("dgx-h100-x128-ndr-ft", "all-to-all", 64, [G], None),
    "ft-a2a-128-sweep": ("dgx-h100-x128-ndr-ft", "all-to-all", 128, [M, 64 * M], None),
    "ft-ar-ring-128": ("dgx-h100-x128-ndr-ft", "all-reduce", 128, [256 * M], "ring"),
    "ft-ar-tree-128": ("dgx-h100-x128-ndr-ft", "all-reduce", 128, [256 * M], "tree"),
    "ft-ar-multi-256": ("dgx-h100-x128-ndr-ft", "all-reduce", 256, [G], "multi-ring"),
    "ft-ar-hier-256": ("dgx-h100-x128-ndr-ft", "all-reduce", 256, [G], "hierarchical"),
    "ft-ag-256": ("dgx-h100-x128-ndr-ft", "all-gather", 256, [G], None),
    "ft-rs-hier-128": ("dgx-h100-x128-ndr-ft", "reduce-scatter", 128, [G], "hierarchical"),
    "ft-bcast-256": ("dgx-h100-x128-ndr-ft", "broadcast", 256, [G], None),
    "2to1-a2a-128": ("dgx-h100-x128-ndr-ft-2to1", "all-to-all", 128, [G], None),
    "2to1-ar-multi-256": ("dgx-h100-x128-ndr-ft-2to1", "all-reduce", 256, [G], "multi-ring"),
    "2to1-ag-multi-256": ("dgx-h100-x128-ndr-ft-2to1", "all-gather", 256, [G], "multi-ring"),
    "rail-a2a-128-sweep": ("dgx-h100-x16-ndr", "all-to-all", 128, [G, 16 * M, G], None),
    "rail-ar-128": ("dgx-h100-x16-ndr", "all-reduce", 128, [G], None),
    "rail-bcast-tree": ("dgx-h100-x16-ndr", "broadcast", 96, [G], "tree"),
    "superpod-a2a-128": ("dgx-superpod-h100-16su", "all-to-all", 128, [G], None),
    "superpod-ar-tree-2048": ("dgx-superpod-h100-16su", "all-reduce", 2048, [G], "tree"),
    "roce-ar-4096": ("llama3-24k-roce", "all-reduce", 4096, [G], None),
    "roce-ar-ring-4096": ("llama3-24k-roce", "all-reduce", 4096, [G], "ring"),
    "roce-a2a-64": ("llama3-24k-roce", "all-to-all", 64, [G], None),
    "roce-rs-multi-4096": ("llama3-24k-roce", "reduce-scatter", 4096, [G], "multi-ring"),
}

# name: (topology, [(op, first GPU, GPU stride, ranks, bytes, algorithm, start s)])
TOGETHER = {
    "2to1-two-a2a": ("dgx-h100-x128-ndr-ft-2to1", [
        ("all-to-all", 0, 1, 64, G, None, 0.0), ("all-to-all", 64, 1, 64, G, None, 0.0)]),
    "ft-ring-and-a2a": ("dgx-h100-x128-ndr-ft", [
        ("all-reduce", 0, 8, 32, G, "ring", 0.0), ("all-to-all", 0, 1, 64, 256 * M, None, 1e-3),
        ("all-gather", 3, 8, 16, G, "ring", 2e-3)]),
    "rail-strided": ("dgx-h100-x16-ndr", [
        ("all-reduce", 0, 9, 14, G, "ring", 0.0), ("all-reduce", 1, 9, 14, G, "ring", 0.0),
        ("all-to-all", 0, 3, 40, G, None, 5e-4)]),
}

# name: (topology, op, first GPU, stride, ranks, bytes, algorithm)
ESTIMATES = {
    "est-node-ring": ("dgx-h100", "all-reduce", 0, 1, 8, G, "ring"),
    "est-ft-tree": ("dgx-h100-x128-ndr-ft", "all-reduce", 0, 1, 256, G, "tree"),
    "est-ft-a2a": ("dgx-h100-x128-ndr-ft", "all-to-all", 0, 5, 100, G, None),
    "est-2to1-multi": ("dgx-h100-x128-ndr-ft-2to1", "all-gather", 0, 1, 128, G, "multi-ring"),
    "est-rail-hier": ("dgx-h100-x16-ndr", "reduce-scatter", 0, 1, 128, G, "hierarchical"),
    "est-roce-ring": ("llama3-24k-roce", "all-reduce", 0, 4, 2048, G, "ring"),
    "est-roce-tree": ("llama3-24k-roce", "all-reduce", 0, 1, 4096, G, "tree"),
    "est-mesh-a2a": ("mi300x-8", "all-to-all", 0, 1, 8, G, None),
    "est-pcie-tree": ("pcie-a100", "broadcast", 0, 1, 8, G, "tree"),
}


@lru_cache(maxsize=None)
def topology(name: str):
    return load_topology(name)


def sweep_times(name: str) -> dict:
    preset, op, ranks, sizes, algorithm = SWEEPS[name]
    results = sweep_collective(op, sizes, ranks, topology(preset), algorithm)
    return {"us": [r.time_s * 1e6 for r in results],
            "algorithms": [r.algorithm for r in results]}


def together_times(name: str) -> dict:
    preset, runs = TOGETHER[name]
    graph = topology(preset)
    gpus = gpu_nodes(graph)
    env = simpy.Environment()
    network = FlowNetwork(env, graph)
    done = []

    def later(op, members, nbytes, algorithm, delay):
        yield env.timeout(delay)
        done.append((len(done), (yield run_collective(env, network, op, members, nbytes,
                                                      algorithm))))

    for op, first, stride, ranks, nbytes, algorithm, start in runs:
        members = gpus[first::stride][:ranks]
        env.process(later(op, members, nbytes, algorithm, start))
    env.run()
    runs_by_start = sorted(done, key=lambda d: (d[1].start, d[1].collective.value, d[0]))
    return {"us": [t * 1e6 for _, r in runs_by_start for t in (r.start, r.end)],
            "algorithms": [r.algorithm for _, r in runs_by_start]}


def estimate_us(name: str) -> dict:
    preset, op, first, stride, ranks, nbytes, algorithm = ESTIMATES[name]
    graph = topology(preset)
    members = gpu_nodes(graph)[first::stride][:ranks]
    algo, phases = collective_phases(op, members, nbytes, graph, algorithm)
    return {"us": [estimate_time(phases, graph) * 1e6], "algorithms": [algo]}


def all_values() -> dict[str, dict]:
    values = {name: sweep_times(name) for name in SWEEPS}
    values.update({name: together_times(name) for name in TOGETHER})
    values.update({name: estimate_us(name) for name in ESTIMATES})
    return values


# Simulated microseconds at commit 13dc3f2 (module docstring).
RECORDED: dict[str, dict] = {
    'node-ar-ring': {'us': [372.72198489751884], 'algorithms': ['ring/Simple']},
    'node-ar-tree': {'us': [71.01999035156486], 'algorithms': ['tree/LL128']},
    'node-ag': {'us': [2565.975879180151], 'algorithms': ['ring/Simple']},
    'node-rs': {'us': [2565.975879180151], 'algorithms': ['ring/Simple']},
    'node-a2a': {'us': [2545.575879180151], 'algorithms': ['direct/Simple']},
    'node-bcast-tree': {'us': [2903.7438619201725], 'algorithms': ['tree']},
    'node-reduce': {'us': [2907.5438619201727], 'algorithms': ['ring/Simple']},
    'pcie-ar': {'us': [19661.618666666665], 'algorithms': ['ring/Simple']},
    'pcie-a2a': {'us': [22383.721333333335], 'algorithms': ['direct/Simple']},
    'mesh-ar-ring': {'us': [7354.032], 'algorithms': ['ring']},
    'mesh-a2a': {'us': [525.288], 'algorithms': ['direct']},
    'ft-a2a-64': {'us': [19595.818666666662], 'algorithms': ['direct/Simple']},
    'ft-a2a-128-sweep': {'us': [50.260000000000005, 1333.12],
                         'algorithms': ['direct/LL', 'direct/Simple']},
    'ft-ar-ring-128': {'us': [2373.8936239782015], 'algorithms': ['ring/LL128']},
    'ft-ar-tree-128': {'us': [12603.967407407406], 'algorithms': ['tree/Simple']},
    'ft-ar-multi-256': {'us': [8398.946049046323], 'algorithms': ['ring/LL128']},
    'ft-ar-hier-256': {'us': [10885.19442502697], 'algorithms': ['hierarchical']},
    'ft-ag-256': {'us': [3989.2799999999997], 'algorithms': ['ring/Simple']},
    'ft-rs-hier-128': {'us': [5259.215879180151], 'algorithms': ['hierarchical']},
    'ft-bcast-256': {'us': [2818.6026666666667], 'algorithms': ['ring/Simple']},
    '2to1-a2a-128': {'us': [33576.832], 'algorithms': ['direct/Simple']},
    '2to1-ar-multi-256': {'us': [8398.946049046323], 'algorithms': ['ring/LL128']},
    '2to1-ag-multi-256': {'us': [3989.2799999999997], 'algorithms': ['ring/Simple']},
    'rail-a2a-128-sweep': {'us': [20993.92, 350.07999999999913, 20993.920000000002],
                           'algorithms': ['direct/Simple', 'direct/Simple', 'direct/Simple']},
    'rail-ar-128': {'us': [6045.789098901099], 'algorithms': ['nvls-tree/Simple']},
    'rail-bcast-tree': {'us': [22417.621333333333], 'algorithms': ['tree']},
    'superpod-a2a-128': {'us': [20993.92], 'algorithms': ['direct/Simple']},
    'superpod-ar-tree-2048': {'us': [45027.64266666667], 'algorithms': ['tree/Simple']},
    'roce-ar-4096': {'us': [6299.44], 'algorithms': ['nvls-tree/Simple']},
    'roce-ar-ring-4096': {'us': [25033.731880108986], 'algorithms': ['ring/LL128']},
    'roce-a2a-64': {'us': [19595.818666666662], 'algorithms': ['direct/Simple']},
    'roce-rs-multi-4096': {'us': [12523.865940054493], 'algorithms': ['ring/LL128']},
    '2to1-two-a2a': {'us': [0.0, 22392.02133333333, 0.0, 22392.02133333333],
                     'algorithms': ['direct/Simple', 'direct/Simple']},
    'ft-ring-and-a2a': {
        'us': [0.0, 49256.896, 1000.0, 5999.483142857142, 2000.0, 26896.148995345506],
        'algorithms': ['ring/Simple', 'direct/Simple', 'ring/Simple']},
    'rail-strided': {'us': [0.0, 42064.942476190474, 0.0, 63316.08274285715, 500.0, 22332.7808],
                     'algorithms': ['ring/Simple', 'ring/Simple', 'direct/Simple']},
    'est-node-ring': {'us': [5123.551758360301], 'algorithms': ['ring/Simple']},
    'est-ft-tree': {'us': [44943.64266666667], 'algorithms': ['tree/Simple']},
    'est-ft-a2a': {'us': [22168.325120000012], 'algorithms': ['direct/Simple']},
    'est-2to1-multi': {'us': [3373.557333333333], 'algorithms': ['ring/Simple']},
    'est-rail-hier': {'us': [5229.215879180151], 'algorithms': ['hierarchical']},
    'est-roce-ring': {'us': [41332.18463215259], 'algorithms': ['ring/LL128']},
    'est-roce-tree': {'us': [45055.64266666667], 'algorithms': ['tree/Simple']},
    'est-mesh-a2a': {'us': [2098.152], 'algorithms': ['direct']},
    'est-pcie-tree': {'us': [89494.48533333333], 'algorithms': ['tree']},
}


def check(now: dict, recorded: dict) -> None:
    assert now["algorithms"] == recorded["algorithms"]
    assert now["us"] == pytest.approx(recorded["us"], rel=1e-9, abs=0)


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_collective_time_unchanged(name):
    check(sweep_times(name), RECORDED[name])


@pytest.mark.parametrize("name", sorted(TOGETHER))
def test_concurrent_collectives_unchanged(name):
    check(together_times(name), RECORDED[name])


@pytest.mark.parametrize("name", sorted(ESTIMATES))
def test_alpha_beta_estimate_unchanged(name):
    check(estimate_us(name), RECORDED[name])


# --- the caches against routes() itself (independent of any recorded number) ---------------
def sample_pairs(graph, count: int = 150) -> list[tuple[str, str]]:
    """Every ordered pair of the first 20 GPUs, and `count` random ones (fixed seed)."""
    gpus = gpu_nodes(graph)
    rng = random.Random(19)
    return ([(a, b) for a in gpus[:20] for b in gpus[:20]]
            + [(rng.choice(gpus), rng.choice(gpus)) for _ in range(count)])


@pytest.mark.parametrize("preset", list_presets())
def test_composed_route_sets_are_routes_exactly(preset):
    """Same paths in the same order as topologies.routing.routes, on every preset; the
    composition is exercised wherever the preset has more than one host."""
    graph = topology(preset)
    sets = RouteSets(graph)
    pairs = sample_pairs(graph, 150 if len(gpu_nodes(graph)) < 8192 else 30)
    for a, b in pairs:
        assert sets.routes(a, b) == routes(graph, a, b), (a, b)
    hosts = {graph.nodes[g]["host"] for g in gpu_nodes(graph)}
    composed = sum(sets.compose(a, b) is not None for a, b in pairs)
    assert composed > (len(pairs) // 2 if len(hosts) > 1 else 0) or preset in (
        "dgx-b200", "gb200-nvl72", "hgx-h100", "mi300x-8")  # host CPUs: routes() answers


def searched(graph, a, b, floor=None):
    """The middles of (a, b) searched directly, as RouteSets kept them before it renamed
    an alike pair's (fewest_hop_paths, then _sorted_distinct)."""
    found = fewest_hop_paths(graph, a, b, floor=floor)
    if found is None or found[1] is None or not found[1]:
        return 0.0, None
    return found[0], _sorted_distinct(found[1])


def switch_pairs_reached(sets: RouteSets, graph) -> set:
    """The (funnel node, funnel node) pairs RouteSets joins for a sample of GPU pairs."""
    pairs = set()
    for a, b in sample_pairs(graph, 200):
        ends = sets.ends(a, b)
        if ends is not None and ends[0].node != ends[1].node:
            pairs.add((ends[0].node, ends[1].node))
    return pairs


@pytest.mark.parametrize("preset", ["llama3-24k-roce", "dgx-superpod-h100-4su",
                                    "dgx-h100-x128-ndr-ft-2to1", "dgx-h100-x16-ndr"])
def test_renamed_middles_are_searched_middles(preset):
    """A switch pair's middles renamed from an alike pair's (RouteSets._search) are the
    middles searched for it directly, widest and at a lower floor, on the leaf pairs GPU
    routes join and on every pair of the first 12 switches; and renaming happens."""
    graph = topology(preset)
    sets = RouteSets(graph)
    switches = [n for n, kind in graph.nodes(data="type") if kind == "switch"][:12]
    pairs = sorted(switch_pairs_reached(sets, graph)) + [
        (a, b) for a in switches for b in switches if a != b]
    for a, b in pairs:
        widest, middles = sets._search(a, b, None)
        assert (widest, middles) == searched(graph, a, b), (a, b)
        if middles:
            assert sets._search(a, b, widest / 2) == searched(graph, a, b, widest / 2)
    assert len(sets._alike) < len(pairs)


def random_pods(seed: int) -> nx.DiGraph:
    """A random two-tier-per-pod fabric with a core: leaves (with a dead-end NIC and GPU
    each) on all their pod's spines, spines on random cores, bandwidths 1 or 2 drawn per
    link, so that some leaves share their ways to the spines and some do not."""
    rng = random.Random(seed)
    graph = nx.DiGraph()

    def link(a, b, kind="x"):
        bandwidth = rng.choice([1.0, 2.0])
        for u, v in ((a, b), (b, a)):
            graph.add_edge(u, v, bandwidth=bandwidth, latency=1e-6, kind=kind)
    cores = [f"core{c}" for c in range(rng.randint(1, 3))]
    for node in cores:
        graph.add_node(node, type="switch")
    for pod in range(rng.randint(2, 3)):
        spines = [f"spine{pod}.{s}" for s in range(rng.randint(1, 3))]
        for spine in spines:
            graph.add_node(spine, type="switch")
            for core in rng.sample(cores, rng.randint(1, len(cores))):
                link(spine, core)
        for leaf in range(rng.randint(2, 4)):
            name = f"leaf{pod}.{leaf}"
            graph.add_node(name, type="switch")
            graph.add_node(f"nic{pod}.{leaf}", type="nic")
            graph.add_node(f"gpu{pod}.{leaf}", type="gpu", host=0)
            link(name, f"nic{pod}.{leaf}")
            link(f"nic{pod}.{leaf}", f"gpu{pod}.{leaf}")
            for spine in spines:
                link(name, spine)
    return graph


def random_twins(seed: int) -> nx.DiGraph:
    """A random directed graph of five switches (links one way only, bandwidth 1 or 2)
    in which two switches get a twin: the same links out and in, and at random a link
    between the two: pairs with alike ways that are, or are not, linked themselves."""
    rng = random.Random(seed)
    graph = nx.DiGraph()
    base = [f"s{i}" for i in range(5)]
    graph.add_nodes_from(base, type="switch")
    for a in base:
        for b in base:
            if a != b and rng.random() < 0.4:
                graph.add_edge(a, b, bandwidth=rng.choice([1.0, 2.0]), latency=1e-6, kind="x")
    for node in rng.sample(base, 2):
        twin = node + "t"
        graph.add_node(twin, type="switch")
        for _, v, attrs in list(graph.out_edges(node, data=True)):
            graph.add_edge(twin, v, **attrs)
        for u, _, attrs in list(graph.in_edges(node, data=True)):
            graph.add_edge(u, twin, **attrs)
        if rng.random() < 0.5:
            a, b = rng.sample([node, twin], 2)
            graph.add_edge(a, b, bandwidth=1.0, latency=1e-6, kind="x")
    return graph


@pytest.mark.parametrize("seed", range(60))
def test_renamed_middles_on_random_fabrics(seed):
    """As above, on every pair of non-GPU nodes of random fabrics (pods of leaves and
    spines; directed graphs with twins), widest and at floor 1."""
    graph = random_pods(seed) if seed % 2 else random_twins(seed)
    sets = RouteSets(graph)
    nodes = [n for n, kind in graph.nodes(data="type") if kind != "gpu"]
    for a in nodes:
        for b in nodes:
            if a != b:
                assert sets._search(a, b, None) == searched(graph, a, b), (a, b)
                assert sets._search(a, b, 1.0) == searched(graph, a, b, 1.0), (a, b)


def pair_rule(graph, index: dict):
    """The per-pair rule over routes()' full routes (the reference EcmpRoutes must equal):
    a function choosing for (a, b) against `routed`, with per-pair turns."""
    reference: dict = {}

    def choose(a, b, routed):
        if (a, b) not in reference:
            reference[(a, b)] = _PairRoutes(
                [tuple(index[e] for e in zip(p, p[1:])) for p in routes(graph, a, b)])
        links = reference[(a, b)].least_loaded(routed)
        for link in links:
            routed[link] += 1
        return links
    return choose


@pytest.mark.parametrize("preset", ["dgx-h100-x128-ndr-ft-2to1", "dgx-h100-x16-ndr",
                                    "dgx-superpod-h100-4su", "pcie-a100", "mi300x-8"])
def test_ecmp_choice_is_the_per_pair_rule_on_full_routes(preset):
    """EcmpRoutes (shared middles, per-pair prefix, suffix and turn) chooses what the
    per-pair rule over routes()' full routes chooses, flow after flow, with releases."""
    graph = topology(preset)
    index = {e: i for i, e in enumerate(graph.edges)}
    fast, rule = EcmpRoutes(graph, index), pair_rule(graph, index)
    routed = [0] * len(index)
    rng = random.Random(7)
    pairs = sample_pairs(graph, 100)
    live = []
    for step in range(3000):
        a, b = rng.choice(pairs)
        if a == b:
            continue
        expected = rule(a, b, routed)
        assert fast.choose(a, b) == expected
        live.append(expected)
        if step % 3 == 2:
            done = live.pop(rng.randrange(len(live)))
            fast.release(done)
            for link in done:
                routed[link] -= 1
        assert fast.routed == routed


def reference_shares(graph, a: str, b: str) -> tuple[float, dict]:
    """The per-route loop sim.collective_algorithms ran before (commit 13dc3f2)."""
    paths = routes(graph, a, b)
    shares: dict = defaultdict(float)
    latency = 0.0
    for path in paths:
        edges = list(zip(path, path[1:]))
        latency = max(latency, sum(graph.edges[e]["latency"] for e in edges))
        for e in edges:
            shares[e] += 1 / len(paths)
    return latency, dict(shares)


@pytest.mark.parametrize("preset", ["dgx-h100-x128-ndr-ft", "dgx-superpod-h100-16su",
                                    "llama3-24k-roce", "pcie-h100-nvl", "mi300x-8"])
def test_route_shares_are_the_per_route_loop_bit_for_bit(preset):
    graph = topology(preset)
    fast = RouteShares(graph)
    edges = list(graph.edges)
    for a, b in sample_pairs(graph, 60):
        latency, ids, shares = fast.of(a, b)
        want_latency, want = reference_shares(graph, a, b)
        assert latency == want_latency
        assert {edges[i]: s for i, s in zip(ids.tolist(), shares.tolist())} == want


@pytest.mark.parametrize("preset,ranks", [("dgx-h100-x128-ndr-ft", 80),
                                          ("dgx-h100-x128-ndr-ft-2to1", 72),
                                          ("dgx-superpod-h100-4su", 40),
                                          ("llama3-24k-roce", 48), ("pcie-a100", 8)])
def test_choose_many_is_the_per_pair_rule_flow_by_flow(preset, ranks):
    """EcmpRoutes.choose_many (runs through one switch pair chosen from one reading of the
    counts) makes the choices the per-pair rule makes one flow at a time, over thousands of
    flows: an all-to-all's order (runs of a GPU's flows to one leaf), the same again (every
    turn 1), a strided group mixed with single `choose` calls, and releases between phases."""
    graph = topology(preset)
    index = {e: i for i, e in enumerate(graph.edges)}
    fast, rule = EcmpRoutes(graph, index), pair_rule(graph, index)
    routed = [0] * len(index)
    gpus = gpu_nodes(graph)
    members = gpus[:ranks]
    strided = gpus[::max(1, len(gpus) // ranks)][:ranks]
    all_to_all = [(a, b) for a in members for b in members if a != b]
    rng = random.Random(3)
    phases = [all_to_all, all_to_all, [(a, b) for a in strided for b in strided[:9] if a != b],
              [rng.choice(all_to_all) for _ in range(2000)]]
    for number, pairs in enumerate(phases):
        want = [rule(a, b, routed) for a, b in pairs]
        if number == 2:  # alternate choose_many and choose on the same state
            got = []
            for k in range(0, len(pairs), 50):
                got += fast.choose_many(pairs[k:k + 25])
                got += [fast.choose(a, b) for a, b in pairs[k + 25:k + 50]]
        else:
            got = fast.choose_many(pairs)
        assert got == want
        assert fast.routed == routed
        for links in want[::3]:  # some flows finish before the next phase
            fast.release(links)
            for link in links:
                routed[link] -= 1


@pytest.mark.parametrize("preset", ["dgx-h100-x128-ndr-ft", "dgx-h100-x16-ndr", "pcie-a100",
                                    "llama3-24k-roce", "dgx-superpod-h100-4su"])
def test_routes_of_gpus_in_one_funnel_are_routes(preset):
    """Pairs met within the source's funnel search (two GPUs of one host) are read off that
    search (RouteSets._near_routes) wherever it has them, and equal routes()."""
    graph = topology(preset)
    sets = RouteSets(graph)
    gpus = gpu_nodes(graph)[:16]
    read = 0
    for a in gpus:
        for b in gpus:
            near = sets._near_routes(a, b) if a != b else None
            if near is not None:
                read += 1
                assert [list(p) for p in near] == routes(graph, a, b), (a, b)
    assert read or preset == "pcie-a100"  # its GPUs have no funnel: routes() answers


def reference_max_min(flow_links, capacity):
    """The water-filling of sim.maxmin before its arrays were compacted (commit 1f5d0ed)."""
    n_flows = len(flow_links)
    lengths = np.fromiter((len(links) for links in flow_links), dtype=np.int64, count=n_flows)
    flow_of = np.repeat(np.arange(n_flows), lengths)
    link_ids = np.fromiter((l for links in flow_links for l in links), dtype=np.int64,
                           count=int(lengths.sum()))
    used, link_of = np.unique(link_ids, return_inverse=True)
    free = np.asarray(capacity, dtype=float)[used]
    rates = np.zeros(n_flows)
    active = np.ones(n_flows, dtype=bool)
    while active.any():
        live = active[flow_of]
        counts = np.bincount(link_of[live], minlength=len(used))
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(counts > 0, np.maximum(free, 0.0) / counts, np.inf)
        level = share.min()
        bottleneck = share <= level * (1 + 1e-9)
        frozen = np.zeros(n_flows, dtype=bool)
        frozen[flow_of[live & bottleneck[link_of]]] = True
        rates[frozen] = level
        free -= level * np.bincount(link_of[frozen[flow_of]], minlength=len(used))
        active &= ~frozen
    return rates


def test_max_min_is_the_uncompacted_water_filling_bit_for_bit():
    rng = random.Random(11)
    for _ in range(300):
        n_links = rng.randint(1, 40)
        capacity = [rng.choice([1.0, 2.5, 50e9, 25e9, rng.uniform(0.1, 100.0)])
                    for _ in range(n_links)]
        flows = [rng.sample(range(n_links), rng.randint(1, min(6, n_links)))
                 for _ in range(rng.randint(1, 120))]
        assert max_min_rates(flows, capacity).tolist() == \
            reference_max_min(flows, capacity).tolist()


@pytest.mark.parametrize("preset,op,ranks,stride", [
    ("llama3-24k-roce", "all-reduce", 2048, 3), ("dgx-h100-x128-ndr-ft", "all-gather", 256, 1),
    ("dgx-h100-x128-ndr-ft-2to1", "reduce-scatter", 96, 5),
    ("dgx-h100-x16-ndr", "all-reduce", 64, 2),
    ("dgx-h100", "all-reduce", 8, 1), ("dgx-h100-x128-ndr-ft", "broadcast", 128, 7)])
def test_pruned_choice_is_the_least_estimate(preset, op, ranks, stride):
    """The alpha-beta choice (`_fastest`: lower bounds skip estimates that cannot win) is
    the candidate with the least estimate, ties to the first; every bound is at most its
    estimate. (On CUDA GPUs the default is NCCL's choice instead: test_nccl_collectives.)"""
    graph = topology(preset)
    members = gpu_nodes(graph)[::stride][:ranks]
    for nbytes in (4096, M, G):
        candidates = []
        for name in AUTOMATIC[parse_collective(op)]:
            try:
                candidates.append((name, collective_phases(op, members, nbytes, graph, name)[1]))
            except ConfigError:
                continue
        estimates = [estimate_time(phases, graph) for _, phases in candidates]
        for (_, phases), estimate in zip(candidates, estimates):
            assert estimate_lower_bound(phases, graph) <= estimate
        chosen, _ = _fastest(candidates, graph)
        assert chosen == candidates[estimates.index(min(estimates))][0]


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/test_fast_network.py --record")
    import clustersim

    print(f"# recorded with {clustersim.__file__}")
    for key, value in all_values().items():
        print(f"    {key!r}: {value!r},")
