"""Tests for the three-tier Clos builder (`fat_tree_3tier`) and today's fabric presets.

Oracles, independent of the builder's own arithmetic:
- bisection bandwidth by max-flow / min-cut (networkx) between two GPU sets, against the
  closed form of the design;
- route hops and bottleneck against the tier structure and the port rate;
- node, switch and cable counts against the sources: the Llama 3 paper (arXiv 2407.21783,
  section 3.3.1) and NVIDIA's DGX SuperPOD H100 reference architecture (RA-11333-001 V11,
  Tables 3 and 4).

Closed form of the bisection. Take P pods of N GPUs each (one NIC of rate B per GPU),
leaves whose uplinks are their downlinks / r_l, spines whose core uplinks are their leaf
links / r_p. A pod's leaves then send N B / r_l to its spines and its spines send
U = N B / (r_l r_p) to the core. Split the pods into two halves of P/2: all traffic from
one half to the other leaves its pods through the core, so the cut is the smaller of the
NIC, leaf-uplink and pod-uplink totals of a half, (P/2) N B / max(1, r_l, r_l r_p)
= (P/2) U as r >= 1. Split every pod in half instead (half the leaves of each pod on each
side): traffic can turn at the pod's own spines, so the cut is the leaf uplinks of a
half, (P N / 2) B / r_l, whatever r_p.
"""
import functools
import json
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from clustersim.topologies import (
    TopologyError,
    gpu_nodes,
    list_presets,
    load_topology,
    path_bandwidth,
    path_latency,
    route,
    routes,
    validate_topology,
)
from clustersim.topologies import clusters
from clustersim.topologies.clusters import MAX_LEAF_SPINE_LINKS, fat_tree_3tier
from clustersim.topologies.graph import BUILDERS, MAX_GPUS
from clustersim.topologies.routing import MAX_EQUAL_COST_PATHS

# 400 Gb/s per direction in bytes/s: InfiniBand NDR 4x and 400GbE (IBTA roadmap, IEEE 802.3).
B400 = 400e9 / 8
NEW_PRESETS = ["llama3-24k-roce", "dgx-superpod-h100-4su", "dgx-superpod-h100-16su"]


def _tiers(g):
    out = {}
    for _, a in g.nodes(data=True):
        if a.get("tier"):
            out[a["tier"]] = out.get(a["tier"], 0) + 1
    return out


def _bandwidth(g, tier_from, tier_to):
    """Total bandwidth (B/s) of the edges from `tier_from` nodes to `tier_to` nodes."""
    def tier(n):
        a = g.nodes[n]
        return a.get("tier") or a["type"]
    return sum(a["bandwidth"] for u, v, a in g.edges(data=True)
               if tier(u) == tier_from and tier(v) == tier_to)


def _max_flow(g, sources, sinks):
    """Max flow (B/s) from the GPU set `sources` to `sinks`, link bandwidth as capacity,
    through a super source / sink joined by edges of unbounded capacity."""
    h = g.copy()
    h.add_edges_from(("SRC", s) for s in sources)
    h.add_edges_from((t, "SNK") for t in sinks)
    value, _ = nx.minimum_cut(h, "SRC", "SNK", capacity="bandwidth")
    return value


def _gpus_of_pods(g, pods):
    leaf_pod = {n: a["pod"] for n, a in g.nodes(data=True) if a.get("tier") == "leaf"}
    out = []
    for gpu in gpu_nodes(g):
        nic = "nic" + gpu[3:]
        leaf = next(v for v in g.successors(nic) if v in leaf_pod)
        if leaf_pod[leaf] in pods:
            out.append(gpu)
    return out


@functools.lru_cache(maxsize=None)
def _preset(name):
    """Each preset loaded once per test session (the 24K-GPU one takes about a second)."""
    return load_topology(name)


@pytest.fixture
def llama():
    return _preset("llama3-24k-roce")


def test_builder_is_registered():
    assert BUILDERS["fat_tree_3tier"] is fat_tree_3tier


@pytest.mark.parametrize("params", [
    dict(num_nodes=8, nodes_per_pod=2, nodes_per_leaf=1, leaf_oversubscription=2,
         pod_oversubscription=3),
    dict(num_nodes=8, nodes_per_pod=2, nodes_per_leaf=1, pod_oversubscription=7),
    dict(num_nodes=8, nodes_per_pod=2, nodes_per_leaf=2, rails=True, pod_oversubscription=4),
    dict(num_nodes=6, nodes_per_pod=3, nodes_per_leaf=1, num_spines=3, cores_per_plane=2,
         leaf_oversubscription=1.5, pod_oversubscription=2),
])
def test_bisection_between_pod_halves_is_the_closed_form(params):
    g = fat_tree_3tier("dgx-h100", network="ndr", **params)
    pods = params["num_nodes"] // params["nodes_per_pod"]
    n_pod = params["nodes_per_pod"] * 8
    r_l, r_p = params.get("leaf_oversubscription", 1), params["pod_oversubscription"]
    half = set(range(pods // 2))
    a, b = _gpus_of_pods(g, half), _gpus_of_pods(g, set(range(pods)) - half)
    expected = (pods // 2) * n_pod * B400 / (r_l * r_p)
    assert _max_flow(g, a, b) == pytest.approx(expected, rel=1e-9)
    assert _max_flow(g, b, a) == pytest.approx(expected, rel=1e-9)


def test_bisection_within_pods_is_bound_by_the_leaves_not_the_core():
    # Hosts 0, 2, 4, 6 (one leaf each) against 1, 3, 5, 7: every pod is split in half.
    g = fat_tree_3tier("dgx-h100", 8, "ndr", nodes_per_pod=2, nodes_per_leaf=1,
                       leaf_oversubscription=2, pod_oversubscription=5)
    gpus = gpu_nodes(g)
    a = [x for x in gpus if g.nodes[x]["host"] % 2 == 0]
    b = [x for x in gpus if g.nodes[x]["host"] % 2 == 1]
    assert _max_flow(g, a, b) == pytest.approx(len(a) * B400 / 2, rel=1e-9)


def test_llama3_preset_matches_the_paper(llama):
    # Paper: racks of 16 GPUs (2 servers) on one ToR; pods of 192 racks = 3,072 GPUs;
    # 8 pods = 24K GPUs; 400 Gb/s between GPUs; aggregation layer 1:7 oversubscribed.
    gpus = gpu_nodes(llama)
    assert len(gpus) == 8 * 3072 == 24576 and llama.graph["num_nodes"] == 3072
    assert llama.graph["gpus_per_node"] == 8 and llama.graph["fabric"] == "fat-tree"
    assert {llama.nodes[x]["device"] for x in gpus} == {"h100-sxm"}
    leaves = [n for n, a in llama.nodes(data=True) if a.get("tier") == "leaf"]
    assert len(leaves) == 8 * 192
    nics = {leaf: [u for u in llama.predecessors(leaf) if u.startswith("nic")] for leaf in leaves}
    assert {len(n) for n in nics.values()} == {16}
    assert {len({llama.nodes[u]["host"] for u in n}) for n in nics.values()} == {2}
    assert {llama.nodes[leaf]["pod"] for leaf in leaves} == set(range(8))
    assert {a["bandwidth"] for u, v, a in llama.edges(data=True) if a["kind"] == "roce"
            and u.startswith("nic")} == {B400}
    # Full bisection inside a pod: leaf uplinks = leaf downlinks.
    assert _bandwidth(llama, "leaf", "spine") == pytest.approx(_bandwidth(llama, "nic", "leaf"))
    # 1:7 at the aggregation layer: each pod's core uplinks are 1/7 of its leaf bandwidth.
    for pod in (0, 7):
        to_core = sum(a["bandwidth"] for u, v, a in llama.edges(data=True)
                      if llama.nodes[u].get("tier") == "spine" and llama.nodes[u]["pod"] == pod
                      and llama.nodes[v].get("tier") == "core")
        assert to_core == pytest.approx(3072 * B400 / 7, rel=1e-9)
    assert _tiers(llama) == {"leaf": 1536, "spine": 8 * 16, "core": 16 * 27}


def test_llama3_cross_pod_route_climbs_to_the_core(llama):
    src, dst = "gpu0", "gpu24575"  # pod 0 and pod 7
    paths = routes(llama, src, dst)
    tiers = [llama.nodes[n].get("tier") or llama.nodes[n]["type"] for n in paths[0]]
    assert tiers == ["gpu", "nic", "leaf", "spine", "core", "spine", "leaf", "nic", "gpu"]
    # One path per (spine, core of that spine's plane): 16 spines x 27 cores per plane.
    assert len(paths) == 16 * 27 <= MAX_EQUAL_COST_PATHS
    plane = [[llama.nodes[n]["plane"] for n in p[3:6]] for p in paths]
    assert all(a == b == c for a, b, c in plane)
    assert path_bandwidth(llama, paths[0]) == B400  # NIC-bound: core links are wider
    assert path_latency(llama, paths[0]) == pytest.approx(8e-6)  # 2 PCIe + 6 network edges
    in_pod = routes(llama, "gpu0", "gpu3071")  # same pod, other rack
    assert len(in_pod) == 16 and [llama.nodes[n].get("tier") for n in in_pod[0][2:5]] == [
        "leaf", "spine", "leaf"]
    assert route(llama, "gpu0", "gpu15") == ["gpu0", "nic0", "leaf0", "nic15", "gpu15"]


def test_llama3_scaled_bisection_by_max_flow():
    # The preset's per-rack and per-tier ratios on 4 pods of 4 racks: small enough for max-flow.
    spec = json.loads((Path(clusters.__file__).parent / "presets" / "llama3-24k-roce.json")
                      .read_text(encoding="utf-8"))
    params = {**spec["params"], "num_nodes": 32, "nodes_per_pod": 8}
    g = fat_tree_3tier(**params)
    a, b = _gpus_of_pods(g, {0, 1}), _gpus_of_pods(g, {2, 3})
    assert _max_flow(g, a, b) == pytest.approx(2 * 64 * B400 / 7, rel=1e-9)


def test_superpod_4su_matches_the_reference_architecture():
    # RA Table 4, 4 SUs: 127 nodes, 1,016 GPUs, 32 leaf and 16 spine switches,
    # 1,020 node-leaf cables (1,016 GPUs + 4 UFM, left out here), 1,024 spine-leaf cables.
    g = _preset("dgx-superpod-h100-4su")
    assert g.graph["num_nodes"] == 127 and len(gpu_nodes(g)) == 1016
    assert _tiers(g) == {"leaf": 32, "spine": 16} and g.graph["fabric"] == "rail"
    assert _bandwidth(g, "nic", "leaf") / B400 == 1016
    assert _bandwidth(g, "leaf", "spine") / B400 == pytest.approx(1024)
    # Rail-optimized: the same rail in one SU is one switch hop; other rails climb.
    assert route(g, "gpu0", "gpu8") == ["gpu0", "nic0", "rail0.0", "nic8", "gpu8"]
    assert [g.nodes[n].get("tier") for n in route(g, "gpu0", "gpu9")[2:5]] == [
        "leaf", "spine", "leaf"]
    assert [g.nodes[n].get("tier") for n in route(g, "gpu0", "gpu256")[2:5]] == [
        "leaf", "spine", "leaf"]


def test_superpod_16su_matches_the_reference_architecture():
    # RA Table 3, 16 SUs: 512 nodes, 4,096 GPUs, 128 leaf, 128 spine, 64 core switches,
    # 4,096 node-leaf, leaf-spine and spine-core cables; 64-port switches, 32 down 32 up.
    g = _preset("dgx-superpod-h100-16su")
    assert g.graph["num_nodes"] == 512 and len(gpu_nodes(g)) == 4096
    assert _tiers(g) == {"leaf": 128, "spine": 128, "core": 64}
    for down, up in (("nic", "leaf"), ("leaf", "spine"), ("spine", "core")):
        assert _bandwidth(g, down, up) / B400 == pytest.approx(4096)
    for n, a in g.nodes(data=True):
        if a.get("tier"):
            ports = sum(e["bandwidth"] for _, _, e in g.out_edges(n, data=True)) / B400
            assert ports == pytest.approx(64), n
    # Non-blocking: half the pods to the other half at full NIC rate (max-flow).
    a, b = _gpus_of_pods(g, {0, 1}), _gpus_of_pods(g, {2, 3})
    assert _max_flow(g, a, b) == pytest.approx(2048 * B400, rel=1e-9)
    paths = routes(g, "gpu0", "gpu4095")
    assert len(paths) == 32 * 2 and path_bandwidth(g, paths[0]) == B400


@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_new_presets_load_validate_and_cite_a_source(preset):
    g = _preset(preset)
    validate_topology(g)
    assert preset in list_presets() and g.graph["name"] == preset
    text = g.graph["description"]
    assert ("arXiv 2407.21783" in text) or ("RA-11333-001" in text)


@pytest.mark.parametrize("preset", NEW_PRESETS + ["dgx-h100-x128-ndr-ft", "selene-a100"])
def test_equal_cost_paths_of_presets_stay_under_the_route_limit(preset):
    g = _preset(preset)
    gpus = gpu_nodes(g)
    for dst in (gpus[len(gpus) // 2], gpus[-1]):
        assert 1 <= len(routes(g, gpus[0], dst)) <= MAX_EQUAL_COST_PATHS


def test_default_switch_counts_keep_links_at_least_one_port_wide():
    g = fat_tree_3tier("hgx-h100", 64, "roce-400g", nodes_per_pod=16, nodes_per_leaf=2,
                       leaf_oversubscription=3, pod_oversubscription=2)
    # leaf: 16 NICs / 3 = 5.33 ports up -> 5 spines of 1.07 ports; spine: 8 leaves x 1.07
    # ports / 2 = 4.27 ports up -> 4 cores per plane of 1.07 ports.
    assert _tiers(g) == {"leaf": 32, "spine": 4 * 5, "core": 5 * 4}
    widths = {a["bandwidth"] for _, _, a in g.edges(data=True) if a["kind"] == "roce"}
    assert min(widths) == B400 and max(widths) == pytest.approx(16 * B400 / 3 / 5)
    # A spine whose whole uplink is under one port gets one core link that narrow.
    thin = fat_tree_3tier("hgx-h100", 16, "roce-400g", nodes_per_pod=8, nodes_per_leaf=2,
                          leaf_oversubscription=3, pod_oversubscription=7)
    assert _tiers(thin)["core"] == 5  # 2 pods of 8 servers: 64 NICs each, 1:3 then 1:7
    assert _bandwidth(thin, "spine", "core") == pytest.approx(2 * 64 * B400 / 21)


def test_one_pod_has_no_core_and_one_leaf_no_spine():
    assert "core" not in _tiers(fat_tree_3tier("dgx-h100", 4, nodes_per_pod=4, nodes_per_leaf=2))
    assert _tiers(fat_tree_3tier("dgx-h100", 2, nodes_per_pod=2, nodes_per_leaf=2)) == {"leaf": 1}


BAD = [
    ({"num_nodes": 10**5}, "fat_tree_3tier: num_nodes=100000 x 8 GPUs of 'dgx-h100'"),
    ({"num_nodes": 10**18}, f"over the limit of {MAX_GPUS} GPUs"),
    ({"num_nodes": 0}, "num_nodes must be a positive integer"),
    ({"nodes_per_pod": 6, "nodes_per_leaf": 4},
     "nodes_per_pod must be a multiple of nodes_per_leaf"),
    ({"num_spines": 10**6}, "num_spines must be at most"),
    ({"num_nodes": 64, "nodes_per_pod": 2, "nodes_per_leaf": 1, "cores_per_plane": 10**6},
     "cores_per_plane must be at most"),
    ({"num_nodes": 2, "nodes_per_pod": 65536, "nodes_per_leaf": 65536, "rails": True},
     "num_spines (default: nodes_per_leaf x NICs per leaf per host"),
    ({"nodes_per_pod": 10**400, "nodes_per_leaf": 10**400}, "nodes_per_pod must be at most 65536"),
    ({"nodes_per_leaf": 10**6}, "nodes_per_leaf must be at most 65536 hosts"),
    ({"leaf_oversubscription": 0.5}, "leaf_oversubscription must be a number >= 1"),
    ({"pod_oversubscription": float("nan")}, "pod_oversubscription must be a number >= 1"),
    ({"rails": 1}, "rails must be true or false"),
]


@pytest.mark.parametrize("params,rule", BAD)
def test_bad_params_refuse_in_one_line_before_building(params, rule, monkeypatch):
    def built(*args, **kwargs):
        raise AssertionError("a node was built before the checks")
    monkeypatch.setattr(clusters, "add_host", built)
    with pytest.raises(TopologyError) as info:
        fat_tree_3tier(**params)
    message = str(info.value)
    assert rule in message and "\n" not in message and message.startswith("fat_tree_3tier: ")


def test_limits_name_the_rule():
    with pytest.raises(TopologyError, match=f"<= {MAX_LEAF_SPINE_LINKS} leaf-spine links"):
        fat_tree_3tier(num_spines=10**6)
    with pytest.raises(TopologyError, match=r"MAX_LEAF_SPINE_LINKS\)"):
        fat_tree_3tier(num_nodes=64, nodes_per_pod=2, nodes_per_leaf=1, cores_per_plane=10**6)


def test_bad_file_params_refuse_in_one_line_within_the_harness_time_bound(tmp_path):
    # A subprocess with a wall-clock bound: absurd sizes must be refused, never built.
    files = []
    for i, (params, _) in enumerate(BAD):
        if any(isinstance(v, float) and v != v for v in params.values()):
            continue  # NaN is not JSON
        path = tmp_path / f"bad{i}.json"
        path.write_text(json.dumps({"builder": "fat_tree_3tier", "params": params}))
        files.append(str(path))
    code = ("import sys\nfrom clustersim.topologies import load_topology, TopologyError\n"
            "for f in sys.argv[1:]:\n"
            "    try:\n        load_topology(f)\n        print('BUILT', f)\n"
            "    except TopologyError as e:\n        print(str(e).count(chr(10)), e)\n")
    out = subprocess.run([sys.executable, "-c", code, *files], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert len(out) == len(files) and all(line.startswith("0 topology file ") for line in out)
