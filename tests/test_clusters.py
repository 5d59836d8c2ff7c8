"""Tests for multi-node topologies: node kinds, fat-tree and rail-optimized clusters, ECMP
routes and the cluster presets. Oracles are datasheet / spec rates and the fabric rules."""
import json

import networkx as nx
import pytest

from clustersim.topologies import (
    DEVICES,
    TopologyError,
    fat_tree,
    get_device,
    gpu_nodes,
    host_of,
    list_presets,
    load_topology,
    node,
    path_bandwidth,
    rail_optimized,
    route,
    routes,
    same_host,
    single_node,
    topology_to_dict,
    validate_topology,
)

# IB 4x link rates (IBTA roadmap) and Ethernet, Gb/s -> bytes/s per direction.
HDR, NDR, GBE400 = 200e9 / 8, 400e9 / 8, 400e9 / 8
# PCI-SIG raw x16 rates per direction: Gen4 16 GT/s, Gen5 32 GT/s, x16 lanes / 8 bits.
GEN4, GEN5 = 16e9 * 16 / 8, 32e9 * 16 / 8
# NVLink per GPU per direction = datasheet bidirectional / 2.
NVLINK3, NVLINK4 = 600e9 / 2, 900e9 / 2


def _edges(g, kind):
    return [(u, v, a) for u, v, a in g.edges(data=True) if a["kind"] == kind]


def _uplink_downlink(g, leaf):
    up = sum(a["bandwidth"] for _, v, a in g.out_edges(leaf, data=True) if v.startswith("spine"))
    down = sum(a["bandwidth"] for _, v, a in g.out_edges(leaf, data=True) if v.startswith("nic"))
    return up, down


def test_a100_pcie_matches_datasheet_and_has_no_nvlink():
    spec = get_device("a100-pcie")
    assert (spec.name, spec.peak("bf16"), spec.peak("tf32")) == ("a100-80gb-pcie", 312e12, 156e12)
    assert (spec.hbm_bandwidth, spec.memory_bytes, spec.nvlink_bandwidth) == (1935e9, 79.25 * 2**30, 0)
    with pytest.raises(TopologyError, match="'h100-sxm': nvlink_bandwidth must be > 0"):
        type(spec)(name="h100-sxm", peak_flops={}, hbm_bandwidth=1.0, memory_bytes=1.0,
                   nvlink_bandwidth=0, sm_count=132)
    with pytest.raises(TopologyError, match="has no NVLink"):
        single_node("a100-80gb-pcie")
    assert all(d.nvlink_bandwidth > 0 for n, d in DEVICES.items() if "pcie" not in n)


@pytest.mark.parametrize("kind, nvlink, pcie", [
    ("dgx-a100", NVLINK3, GEN4), ("hgx-a100", NVLINK3, GEN4), ("dgx-h100", NVLINK4, GEN5),
    ("hgx-h100", NVLINK4, GEN5), ("dgx-h200", NVLINK4, GEN5), ("hgx-h200", NVLINK4, GEN5)])
def test_nvswitch_node_rates_and_host_cpu(kind, nvlink, pcie):
    g = node(kind, nics=True)
    assert g.graph["fabric"] is None and len(gpu_nodes(g)) == 8
    assert g.nodes["host0"]["type"] == "host" and g.nodes["nic5"]["type"] == "nic"
    for gpu in gpu_nodes(g):
        assert g.edges[gpu, "nvswitch0"] == {"bandwidth": nvlink, "latency": 1e-6, "kind": "nvlink"}
        assert g.edges["nvswitch0", gpu]["bandwidth"] == nvlink
        assert g.edges[gpu, "host0"]["bandwidth"] == g.edges["host0", gpu]["bandwidth"] == pcie
        nic = f"nic{gpu[3:]}"
        assert g.edges[gpu, nic]["bandwidth"] == pcie and g.edges[gpu, nic]["kind"] == "pcie"
    for a in gpu_nodes(g):
        for b in gpu_nodes(g):
            if a != b:
                assert routes(g, a, b) == [[a, "nvswitch0", b]]  # NVLink, not host PCIe


def test_pcie_box_crosses_host_between_halves():
    g = load_topology("pcie-a100")
    assert {a["kind"] for _, _, a in g.edges(data=True)} == {"pcie"}
    assert all(a["bandwidth"] == GEN4 for _, _, a in g.edges(data=True))
    assert [n for n, a in g.nodes(data=True) if a["type"] == "switch"] == ["pcie0.0", "pcie0.1"]
    assert route(g, "gpu1", "gpu3") == ["gpu1", "pcie0.0", "gpu3"]
    assert route(g, "gpu5", "gpu6") == ["gpu5", "pcie0.1", "gpu6"]
    for a in range(4):
        for b in range(4, 8):
            assert routes(g, f"gpu{a}", f"gpu{b}") == [[f"gpu{a}", "pcie0.0", "host0", "pcie0.1", f"gpu{b}"]]
            assert routes(g, f"gpu{b}", f"gpu{a}") == [[f"gpu{b}", "pcie0.1", "host0", "pcie0.0", f"gpu{a}"]]


@pytest.mark.parametrize("network, rate, kind", [("hdr", HDR, "ib"), ("ndr", NDR, "ib"), ("roce-400g", GBE400, "roce")])
@pytest.mark.parametrize("builder", [fat_tree, rail_optimized])
def test_nic_links_carry_the_network_rate(builder, network, rate, kind):
    g = builder("dgx-a100", num_nodes=8, network=network, **({"nodes_per_leaf": 2} if builder is fat_tree else {}))
    nic_links = [(u, v, a) for u, v, a in g.edges(data=True) if "nic" in (g.nodes[u]["type"], g.nodes[v]["type"])
                 and "gpu" not in (g.nodes[u]["type"], g.nodes[v]["type"])]
    assert len(nic_links) == 2 * 64
    assert all(a["bandwidth"] == rate and a["kind"] == kind for _, _, a in nic_links)
    assert all(a["kind"] == kind for u, v, a in g.edges(data=True) if "spine" in u + v)


@pytest.mark.parametrize("r", [1, 2, 4])
def test_fat_tree_uplinks_are_downlinks_over_oversubscription(r):
    g = fat_tree("dgx-h100", num_nodes=10, network="ndr", nodes_per_leaf=4, num_spines=4, oversubscription=r)
    leaves = sorted(n for n, a in g.nodes(data=True) if a.get("tier") == "leaf")
    assert leaves == ["leaf0", "leaf1", "leaf2"]  # the last leaf holds 2 nodes
    for leaf in leaves:
        up, down = _uplink_downlink(g, leaf)
        assert up == pytest.approx(down / r)
        spine_links = {a["bandwidth"] for _, v, a in g.out_edges(leaf, data=True) if v.startswith("spine")}
        assert len(spine_links) == 1 and len([v for v in g.successors(leaf) if v.startswith("spine")]) == 4
    assert _uplink_downlink(g, "leaf0")[1] == 32 * NDR and _uplink_downlink(g, "leaf2")[1] == 16 * NDR


@pytest.mark.parametrize("r", [1, 2, 4])
def test_rail_uplinks_are_downlinks_over_oversubscription(r):
    g = rail_optimized("dgx-h100", num_nodes=8, nodes_per_group=4, oversubscription=r)
    rails = sorted(n for n in g if n.startswith("rail"))
    assert len(rails) == 16 and rails[:3] == ["rail0.0", "rail0.1", "rail1.0"]
    for rail in rails:
        up, down = _uplink_downlink(g, rail)
        assert down == 4 * NDR and up == pytest.approx(down / r)


@pytest.mark.parametrize("spines", [1, 3, 8])
def test_fat_tree_ecmp_paths_equal_spines(spines):
    g = fat_tree("dgx-h100", num_nodes=4, nodes_per_leaf=2, num_spines=spines)
    paths = routes(g, "gpu3", "gpu30")  # host 0 on leaf0 -> host 3 on leaf1
    assert len(paths) == spines and len({p[3] for p in paths}) == spines
    assert all(p[:3] == ["gpu3", "nic3", "leaf0"] and p[4:] == ["leaf1", "nic30", "gpu30"] for p in paths)
    assert route(g, "gpu3", "gpu30") == paths[0] and routes(g, "gpu3", "gpu30", limit=1) == paths[:1]
    assert routes(g, "gpu3", "gpu12") == [["gpu3", "nic3", "leaf0", "nic12", "gpu12"]]  # same leaf


def test_ecmp_order_is_natural_and_deterministic():
    g = fat_tree("dgx-h100", num_nodes=2, nodes_per_leaf=1, num_spines=12)
    assert [p[3] for p in routes(g, "gpu0", "gpu8")] == [f"spine{k}" for k in range(12)]
    with pytest.raises(TopologyError, match="limit must be a positive integer"):
        routes(g, "gpu0", "gpu8", limit=0)


def test_rail_cross_rail_goes_over_spines_same_rail_stays_on_rail():
    g = load_topology("dgx-h100-x16-ndr")
    assert g.graph["fabric"] == "rail" and g.graph["num_nodes"] == 16
    assert routes(g, "gpu3", "gpu11") == [["gpu3", "nic3", "rail3", "nic11", "gpu11"]]
    paths = routes(g, "gpu3", "gpu12")  # local GPU 3 on host 0 -> local GPU 4 on host 1
    assert [p[3] for p in paths] == [f"spine{k}" for k in range(8)]
    assert all(p[2] == "rail3" and p[4] == "rail4" for p in paths)
    for rail in range(8):
        nics = {n for n in g.predecessors(f"rail{rail}") if n.startswith("nic")}
        assert nics == {f"nic{8 * h + rail}" for h in range(16)}


@pytest.mark.parametrize("preset", ["dgx-h100-x16-ndr", "dgx-h100-x128-ndr-ft", "hgx-h100-x8-roce"])
def test_intra_node_over_nvlink_inter_node_through_nics(preset):
    g = load_topology(preset)
    gpus = gpu_nodes(g)
    for a in gpus[8:16]:
        for b in gpus[8:16]:
            if a != b:
                assert routes(g, a, b) == [[a, f"nvswitch{host_of(g, a)}", b]] and same_host(g, a, b)
    for a, b in [(gpus[0], gpus[9]), (gpus[5], gpus[-1]), (gpus[-3], gpus[2])]:
        assert not same_host(g, a, b)
        for path in routes(g, a, b):
            assert path[1] == "nic" + a[3:] and path[-2] == "nic" + b[3:]
            assert sum(g.nodes[n]["type"] == "gpu" for n in path) == 2


def test_single_leaf_cluster_has_no_spines_and_names_default():
    g = fat_tree("dgx-a100", num_nodes=3, network="hdr")
    assert g.graph["name"] == "dgx-a100-x3-hdr-ft" and not [n for n in g if n.startswith("spine")]
    assert route(g, "gpu0", "gpu23") == ["gpu0", "nic0", "leaf0", "nic23", "gpu23"]
    assert fat_tree("dgx-a100", 8, oversubscription=2).graph["name"] == "dgx-a100-x8-ndr-ft-2to1"


def test_cluster_preset_sizes():
    big, blocking = load_topology("dgx-h100-x128-ndr-ft"), load_topology("dgx-h100-x128-ndr-ft-2to1")
    for g, spines in ((big, 32), (blocking, 16)):
        assert len(gpu_nodes(g)) == 1024 and g.graph["num_nodes"] == 128 and g.graph["gpus_per_node"] == 8
        assert len(routes(g, "gpu0", "gpu1023")) == spines
    assert _uplink_downlink(big, "leaf7") == (32 * NDR, 32 * NDR)
    assert _uplink_downlink(blocking, "leaf7") == (16 * NDR, 32 * NDR)
    roce = load_topology("hgx-h100-x8-roce")
    assert {a["kind"] for u, v, a in roce.edges(data=True) if "leaf" in u} == {"roce"}


def test_selene_is_the_megatron_sc21_cluster():
    g = load_topology("selene-a100")
    gpus = gpu_nodes(g)
    assert len(gpus) == 3072 and g.graph["num_nodes"] == 384 and g.graph["fabric"] == "fat-tree"
    assert {g.nodes[n]["device"] for n in gpus} == {"a100-80gb-sxm"}
    assert host_of(g, "gpu3071") == 383 and same_host(g, "gpu8", "gpu15") and not same_host(g, "gpu7", "gpu8")
    assert {a["bandwidth"] for u, v, a in g.edges(data=True) if u.startswith("nic") and "leaf" in v} == {HDR}
    assert path_bandwidth(g, route(g, "gpu0", "gpu3071")) == HDR


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_validates(preset):
    g = load_topology(preset)
    validate_topology(g)
    assert g.graph["name"] == preset and g.graph.get("description")


def test_cluster_round_trips_through_explicit_file(tmp_path):
    g = rail_optimized("dgx-a100", num_nodes=2, network="hdr", num_spines=2)
    path = tmp_path / "rail.json"
    path.write_text(json.dumps(topology_to_dict(g)))
    again = load_topology(str(path))
    assert nx.utils.graphs_equal(g, again) and again.graph["fabric"] == "rail"


def test_gpu_mesh_without_switches_relays_through_a_gpu():
    # A ring of direct GPU links (no switch) still routes: GPUs may relay when they must.
    g = nx.DiGraph(name="ring", num_nodes=1, gpus_per_node=4)
    for i in range(4):
        g.add_node(f"gpu{i}", type="gpu", device="h100-sxm", index=i, host=0)
    for i in range(4):
        for a, b in ((i, (i + 1) % 4), ((i + 1) % 4, i)):
            g.add_edge(f"gpu{a}", f"gpu{b}", bandwidth=1e9, latency=1e-6, kind="nvlink")
    validate_topology(g)
    assert routes(g, "gpu0", "gpu2") == [["gpu0", "gpu1", "gpu2"], ["gpu0", "gpu3", "gpu2"]]


def test_errors_name_the_field():
    with pytest.raises(TopologyError, match="unknown network 'qdr'; known: edr, hdr, ndr"):
        fat_tree("dgx-h100", 2, network="qdr")
    with pytest.raises(TopologyError, match="unknown node kind 'dgx-v100'; known: dgx-a100"):
        rail_optimized("dgx-v100", 2)
    with pytest.raises(TopologyError, match="oversubscription must be a number >= 1"):
        fat_tree("dgx-h100", 8, oversubscription=0.5)
    with pytest.raises(TopologyError, match="fat_tree: num_spines must be a positive integer, got 0"):
        fat_tree("dgx-h100", 8, num_spines=0)
    with pytest.raises(TopologyError, match="rail_optimized: num_nodes must be a positive integer"):
        rail_optimized("dgx-h100", 0)
    with pytest.raises(TopologyError, match="'nic0' is not a gpu node"):
        host_of(node("dgx-h100", nics=True), "nic0")
    g = node("hgx-h100")
    g.graph["fabric"] = "torus"
    with pytest.raises(TopologyError, match="graph attr fabric must be one of fat-tree, rail or None, got 'torus'"):
        validate_topology(g)


def _layered(widths, name="layers"):
    """gpu0 -> layer 0 switches -> ... -> gpu1, every switch linked to every switch of the
    next layer (both directions): prod(widths) equal-cost paths of len(widths) + 1 links."""
    g = nx.DiGraph(name=name, num_nodes=1, gpus_per_node=2)
    for i in range(2):
        g.add_node(f"gpu{i}", type="gpu", device="h100-sxm", index=i, host=0)
    layers = [["gpu0"]] + [[f"s{d}.{k}" for k in range(w)] for d, w in enumerate(widths)]
    layers.append(["gpu1"])
    for layer in layers[1:-1]:
        for n in layer:
            g.add_node(n, type="switch")
    for near, far in zip(layers, layers[1:]):
        for a in near:
            for b in far:
                g.add_edge(a, b, bandwidth=1e9, latency=1e-6, kind="nvlink")
                g.add_edge(b, a, bandwidth=1e9, latency=1e-6, kind="nvlink")
    return g


def test_equal_cost_paths_are_counted_and_refused_above_the_limit_not_listed():
    assert len(routes(_layered([2] * 4), "gpu0", "gpu1")) == 2 ** 4
    wide = _layered([2] * 40)  # 2**40 equal-cost paths: listing them would never end
    with pytest.raises(TopologyError, match=r"route: 1,099,511,627,776 equal-cost paths from "
                                            r"'gpu0' to 'gpu1', above the limit of 65,536"):
        routes(wide, "gpu0", "gpu1")


def test_routes_longer_than_the_hop_limit_are_refused_and_long_ones_do_not_recurse():
    assert len(route(_layered([1] * 63), "gpu0", "gpu1")) == 65  # 64 links: the limit
    with pytest.raises(TopologyError, match="no path from 'gpu0' to 'gpu1' of at most 64 links"):
        route(_layered([1] * 64), "gpu0", "gpu1")
