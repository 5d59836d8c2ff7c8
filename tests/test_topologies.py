"""Tests for topologies: datasheet values, schema invariants of presets, routes, user files,
and one test per validation rule (the message must name the node/edge and the field)."""
import json
import math

import networkx as nx
import pytest

from clustersim.topologies import (
    DEVICES,
    TopologyError,
    device_of,
    get_device,
    gpu_nodes,
    list_presets,
    load_topology,
    path_bandwidth,
    path_latency,
    route,
    single_node,
    topology_to_dict,
    validate_topology,
)

# NVIDIA datasheets (dense tensor-core FLOP/s; NVLink per direction = bidirectional / 2);
# memory: what CUDA reports as the total (GiB x 2^30; topologies/devices.py, "Memory").
DATASHEET = {
    "a100-80gb-sxm": dict(bf16=312e12, fp16=312e12, fp32=156e12, hbm=2039e9, mem=79.25 * 2**30, nvlink=600e9 / 2),
    "h100-sxm": dict(bf16=989.4e12, fp16=989.4e12, fp32=494.7e12, fp8=1978.9e12, hbm=3.35e12, mem=79.11 * 2**30, nvlink=900e9 / 2),
    "h200-sxm": dict(bf16=989.4e12, fp16=989.4e12, fp32=494.7e12, fp8=1978.9e12, hbm=4.8e12, mem=139.81 * 2**30, nvlink=900e9 / 2),
}
PRESET_DEVICE = {"dgx-a100": "a100-80gb-sxm", "dgx-h100": "h100-sxm", "dgx-h200": "h200-sxm"}


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_device_matches_datasheet(name):
    truth, spec = DATASHEET[name], DEVICES[name]
    for dtype in ("bf16", "fp16", "fp32", "fp8"):
        if dtype in truth:
            assert spec.peak(dtype) == truth[dtype]
    assert (spec.hbm_bandwidth, spec.memory_bytes, spec.nvlink_bandwidth) == (truth["hbm"], truth["mem"], truth["nvlink"])


def test_h100_dense_is_half_of_sparse_headline():
    # Datasheet headline BF16 1,979 TFLOPS is with 2:4 sparsity.
    assert get_device("h100").peak("bf16") == pytest.approx(1979e12 / 2, rel=1e-3)


def test_get_device_is_lenient():
    assert get_device("A100").name == "a100-80gb-sxm"
    assert get_device("H100_SXM5").name == "h100-sxm"
    assert get_device(" h200 ").name == "h200-sxm"
    assert get_device("h100").peak("bfloat16") == get_device("h100").peak("bf16")


def test_unknown_device_lists_known_names():
    with pytest.raises(TopologyError, match="unknown device 'v100'; known devices: a100-40gb-sxm, "
                                            ".*h100-sxm, h200-sxm, mi300x"):
        get_device("v100")


def test_missing_dtype_names_device_and_dtypes():
    with pytest.raises(ValueError, match="'a100-80gb-sxm' has no peak FLOP/s for dtype 'fp8'; it has: bf16, fp16, fp32"):
        get_device("a100").peak("fp8")


ALL_PRESETS = ["dgx-a100", "dgx-b200", "dgx-h100", "dgx-h100-x128-ndr-ft",
               "dgx-h100-x128-ndr-ft-2to1", "dgx-h100-x16-ndr", "dgx-h200",
               "dgx-superpod-h100-16su", "dgx-superpod-h100-4su", "gb200-nvl72", "hgx-h100",
               "hgx-h100-x8-roce", "llama3-24k-roce", "mi300x-8", "pcie-a100",
               "pcie-h100-nvl", "selene-a100"]


def test_presets_are_listed():
    assert list_presets() == ALL_PRESETS


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "dgx-h200"])
def test_preset_schema_invariants(preset):
    g = load_topology(preset)
    assert g.graph["name"] == preset and g.graph["num_nodes"] == 1 and g.graph["gpus_per_node"] == 8
    gpus = gpu_nodes(g)
    assert gpus == [f"gpu{i}" for i in range(8)]
    for n, a in g.nodes(data=True):
        assert a["type"] in {"gpu", "switch", "nic", "host"}
    assert all(g.nodes[n]["device"] == PRESET_DEVICE[preset] and g.nodes[n]["host"] == 0 for n in gpus)
    assert g.nodes["nvswitch0"]["type"] == "switch"
    for u, v, a in g.edges(data=True):
        assert a["bandwidth"] > 0 and a["latency"] > 0 and a["kind"] == "nvlink"
        assert g.has_edge(v, u)
    nvlink = DATASHEET[PRESET_DEVICE[preset]]["nvlink"]
    for src in gpus:
        for dst in gpus:
            if src != dst:
                path = route(g, src, dst)
                assert path == [src, "nvswitch0", dst]
                assert path_bandwidth(g, path) == nvlink
                assert path_latency(g, path) == pytest.approx(2e-6)


def test_device_of_and_route_to_self():
    g = load_topology("dgx-h200")
    assert device_of(g, "gpu3").memory_bytes == 139.81 * 2**30
    assert route(g, "gpu3", "gpu3") == ["gpu3"]
    assert path_bandwidth(g, ["gpu3"]) == math.inf and path_latency(g, ["gpu3"]) == 0.0
    with pytest.raises(TopologyError, match="'nvswitch0' is not a gpu node"):
        device_of(g, "nvswitch0")


def test_route_is_deterministic_and_fewest_hops():
    g = nx.DiGraph(name="diamond", num_nodes=1, gpus_per_node=2)
    g.add_node("gpu0", type="gpu", device="h100-sxm", index=0, host=0)
    g.add_node("gpu1", type="gpu", device="h100-sxm", index=1, host=0)
    for mid in ("sw_b", "sw_a"):  # inserted in reverse order; tie must still pick sw_a
        g.add_node(mid, type="switch")
        for u, v in (("gpu0", mid), (mid, "gpu1"), ("gpu1", mid), (mid, "gpu0")):
            g.add_edge(u, v, bandwidth=1e9, latency=1e-6, kind="pcie")
    g.add_edge("gpu0", "gpu1", bandwidth=1.0, latency=1.0, kind="pcie")
    validate_topology(g)
    assert route(g, "gpu0", "gpu1") == ["gpu0", "gpu1"]
    assert route(g, "gpu1", "gpu0") == ["gpu1", "sw_a", "gpu0"]


def test_single_node_params():
    g = single_node("h100", num_gpus=4, bandwidth=1e11, latency=2e-6, name="box")
    assert g.graph["name"] == "box" and len(gpu_nodes(g)) == 4
    assert path_bandwidth(g, route(g, "gpu0", "gpu3")) == 1e11
    with pytest.raises(TopologyError, match="num_gpus must be a positive integer"):
        single_node("h100", num_gpus=0)


def _explicit(num_gpus=2, device="h100-sxm"):
    nodes = [{"id": "nvswitch0", "type": "switch"}]
    edges = []
    for i in range(num_gpus):
        nodes.append({"id": f"gpu{i}", "type": "gpu", "device": device, "index": i, "host": 0})
        for s, d in ((f"gpu{i}", "nvswitch0"), ("nvswitch0", f"gpu{i}")):
            edges.append({"src": s, "dst": d, "bandwidth": 450e9, "latency": 1e-6, "kind": "nvlink"})
    return {"name": "mine", "description": "two gpus", "nodes": nodes, "edges": edges}


def _write(tmp_path, spec, name="topo.json"):
    path = tmp_path / name
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return str(path)


def test_user_file_explicit_round_trip(tmp_path):
    spec = _explicit(device="H100")  # alias is stored canonical
    g = load_topology(_write(tmp_path, spec))
    assert g.graph == {"name": "mine", "num_nodes": 1, "gpus_per_node": 2, "description": "two gpus"}
    assert g.nodes["gpu1"] == {"type": "gpu", "device": "h100-sxm", "index": 1, "host": 0}
    assert path_bandwidth(g, route(g, "gpu0", "gpu1")) == 450e9
    again = load_topology(_write(tmp_path, topology_to_dict(g), "again.json"))
    assert nx.utils.graphs_equal(g, again)


def test_preset_round_trips_through_explicit_file(tmp_path):
    g = load_topology("dgx-a100")
    again = load_topology(_write(tmp_path, topology_to_dict(g)))
    assert nx.utils.graphs_equal(g, again)


def test_user_file_builder_form(tmp_path):
    spec = {"name": "half-dgx", "builder": "single_node", "params": {"device": "a100", "num_gpus": 4}}
    g = load_topology(_write(tmp_path, spec))
    assert g.graph["name"] == "half-dgx" and len(gpu_nodes(g)) == 4


def _error(tmp_path, spec):
    with pytest.raises(TopologyError) as info:
        load_topology(_write(tmp_path, spec))
    return str(info.value)


def _mutated(change):
    spec = _explicit(3)
    change(spec)
    return spec


def test_error_negative_bandwidth(tmp_path):
    spec = _mutated(lambda s: s["edges"][0].update(bandwidth=-1))
    msg = _error(tmp_path, spec)
    assert "topo.json" in msg
    assert "edge gpu0->nvswitch0: bandwidth must be a positive number of bytes/s, got -1" in msg


def test_error_missing_latency_and_kind(tmp_path):
    assert "edge gpu0->nvswitch0: latency" in _error(tmp_path, _mutated(lambda s: s["edges"][0].pop("latency")))
    assert "edge nvswitch0->gpu0: kind" in _error(tmp_path, _mutated(lambda s: s["edges"][1].update(kind="")))


def test_error_unknown_device(tmp_path):
    msg = _error(tmp_path, _mutated(lambda s: s["nodes"][1].update(device="v100")))
    assert "node 'gpu0'" in msg and "unknown device 'v100'" in msg and "h100-sxm" in msg


def test_error_duplicate_gpu_index(tmp_path):
    msg = _error(tmp_path, _mutated(lambda s: s["nodes"][2].update(index=0)))
    assert "node 'gpu1'" in msg and "duplicate gpu index 0" in msg


def test_error_gpu_indices_not_contiguous():
    g = single_node("h100", num_gpus=2)
    nx.relabel_nodes(g, {"gpu1": "gpu5"}, copy=False)
    g.nodes["gpu5"]["index"] = 5
    with pytest.raises(TopologyError, match=r"gpu indices must be 0\.\.1; missing \[1\]"):
        validate_topology(g)


def test_error_gpu_id_must_match_index():
    g = nx.relabel_nodes(single_node("h100", num_gpus=2), {"gpu0": "accel0"})
    with pytest.raises(TopologyError, match=r"node 'accel0': gpu node id must be 'gpu\{index\}', i.e. 'gpu0'"):
        validate_topology(g)


def test_error_edge_to_unknown_node(tmp_path):
    msg = _error(tmp_path, _mutated(lambda s: s["edges"][0].update(dst="nvswitch9")))
    assert "edge gpu0->nvswitch9: dst 'nvswitch9' is not a declared node" in msg


def test_error_bad_node_type(tmp_path):
    msg = _error(tmp_path, _mutated(lambda s: s["nodes"][0].update(type="router")))
    assert "node 'nvswitch0': type must be one of gpu, switch, nic, host, got 'router'" in msg


def test_error_gpu_cannot_reach_gpu(tmp_path):
    # Drop the switch->gpu2 edge: gpu2 can still send but not receive.
    spec = _mutated(lambda s: s["edges"].pop(5))
    assert "gpu 'gpu0' cannot reach gpu 'gpu2'" in _error(tmp_path, spec)


def test_error_unknown_preset_lists_known():
    with pytest.raises(TopologyError, match="unknown topology preset 'dgx-v100'; known "
                                            "presets: " + ", ".join(ALL_PRESETS)):
        load_topology("dgx-v100")


def test_error_invalid_json_names_file_and_position(tmp_path):
    msg = _error(tmp_path, '{"name": "x",\n  "nodes": [,]}')
    assert "topo.json" in msg and "invalid JSON at line 2 column 13" in msg


def test_error_unreadable_file(tmp_path):
    with pytest.raises(TopologyError, match="cannot read topology file .*missing.json"):
        load_topology(str(tmp_path / "missing.json"))


def test_error_builder_params(tmp_path):
    msg = _error(tmp_path, {"name": "x", "builder": "single_node", "params": {"device": "h100", "gpus": 8}})
    assert "params ['gpus'] not accepted by builder 'single_node'" in msg and "num_gpus" in msg
    msg = _error(tmp_path, {"name": "x", "builder": "three_level", "params": {}})
    assert ("builder must be one of fat_tree, fat_tree_3tier, node, rail_optimized, "
            "single_node, got 'three_level'") in msg
    assert "unknown field(s) ['edgs']" in _error(tmp_path, {"name": "x", "nodes": [], "edgs": []})
