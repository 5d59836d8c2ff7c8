"""Device presets against their datasheets (sparse and bidirectional quotes converted here,
so the conversion is checked too), the measured matmul ceilings, aliases, the node kinds
built on them (B200, GB200 NVL72, H100 NVL, MI300X) and their preset files, and the
device table of `clustersim topologies`."""
import itertools
import subprocess
import sys

import pytest

from clustersim.topologies import (
    DEVICES,
    DeviceSpec,
    TopologyError,
    get_device,
    gpu_nodes,
    list_presets,
    load_topology,
    validate_topology,
)
from clustersim.topologies.nodes import NODE_KINDS, NodeKind, node
from clustersim.topologies.routing import path_bandwidth, routes

T, G = 1e12, 1e9
SPARSE = 2  # datasheet headline FLOP/s with 2:4 sparsity = 2 x dense
BIDIR = 2  # datasheet link bandwidth counts both directions

# name: (dense FLOP/s per key, HBM B/s, memory B, link B/s per direction, SMs, W). Each
# number as its source prints it, then converted. Sources: topologies/devices.py docstring.
DATASHEET = {
    # NVIDIA A100 datasheet (dense 312 / 156 as printed), NVLink 600 GB/s bidirectional.
    "a100-80gb-sxm": (dict(bf16=312 * T, fp16=312 * T, fp32=156 * T), 2039 * G, 80 * G, 600 * G / BIDIR, 108, 400),
    "a100-80gb-pcie": (dict(bf16=312 * T, fp16=312 * T, fp32=156 * T), 1935 * G, 80 * G, 0.0, 108, 300),
    "a100-40gb-sxm": (dict(bf16=312 * T, fp16=312 * T, fp32=156 * T), 1555 * G, 40 * G, 600 * G / BIDIR, 108, 400),
    # NVIDIA H100 datasheet, sparse TFLOPS; SXM dense from the whitepaper (989.4 / 494.7 / 1978.9).
    "h100-sxm": (dict(bf16=989.4 * T, fp16=989.4 * T, fp32=494.7 * T, fp8=1978.9 * T), 3.35 * T, 80 * G, 900 * G / BIDIR, 132, 700),
    "h100-pcie": (dict(bf16=1513 * T / SPARSE, fp16=1513 * T / SPARSE, fp32=756 * T / SPARSE, fp8=3026 * T / SPARSE),
                  2 * T, 80 * G, 600 * G / BIDIR, 114, 350),
    "h100-nvl": (dict(bf16=1671 * T / SPARSE, fp16=1671 * T / SPARSE, fp32=835 * T / SPARSE, fp8=3341 * T / SPARSE),
                 3.9 * T, 94 * G, 600 * G / BIDIR, 132, 400),
    # NVIDIA H200 datasheet: H100 SXM compute, 141 GB at 4.8 TB/s.
    "h200-sxm": (dict(bf16=989.4 * T, fp16=989.4 * T, fp32=494.7 * T, fp8=1978.9 * T), 4.8 * T, 141 * G, 900 * G / BIDIR, 132, 700),
    # HGX B200 (8 GPUs, sparse PFLOPS), DGX B200 (1,440 GB, 64 TB/s for 8), NVLink5 1.8 TB/s.
    "b200": (dict(bf16=36e15 / 8 / SPARSE, fp16=36e15 / 8 / SPARSE, fp32=18e15 / 8 / SPARSE,
                  fp8=72e15 / 8 / SPARSE, fp4=144e15 / 8 / SPARSE), 64 * T / 8, 1440 * G / 8, 1.8 * T / BIDIR, 148, 1000),
    # GB200 NVL72 (72 GPUs, sparse PFLOPS), superchip 372 GB / 16 TB/s per 2 GPUs, 130 TB/s NVLink.
    "gb200": (dict(bf16=360e15 / 72 / SPARSE, fp16=360e15 / 72 / SPARSE, fp32=180e15 / 72 / SPARSE,
                   fp8=720e15 / 72 / SPARSE, fp4=1440e15 / 72 / SPARSE), 16 * T / 2, 372 * G / 2, 1.8 * T / BIDIR, 148, 1200),
    # AMD MI300X (AMD's dense TFLOPS; 7 Infinity Fabric links of 128 GB/s bidirectional).
    "mi300x": (dict(bf16=1307.4 * T, fp16=1307.4 * T, fp32=653.7 * T, fp8=2614.9 * T), 5.3 * T, 192 * G,
               7 * 128 * G / BIDIR, 304, 750),
}

# Best measured GEMM TFLOPS (ml-engineering MAMF v2 table), per device and dtype, with the
# devices whose numbers are borrowed from a sibling marked by `assumed`.
MAMF = {
    "a100-80gb-sxm": dict(bf16=271.2), "a100-80gb-pcie": dict(bf16=252.9),
    "h100-sxm": dict(bf16=794.5, fp8=1402.6), "h200-sxm": dict(bf16=794.5, fp8=1453.4),
    "b200": dict(bf16=1745.0, fp8=3432.5), "gb200": dict(bf16=1822.0, fp8=3615.6),
    "mi300x": dict(bf16=668.4),
}
ASSUMED = {"a100-40gb-sxm": "a100-80gb-sxm", "h100-pcie": "h100-sxm", "h100-nvl": "h100-sxm"}


def test_every_device_has_a_datasheet_row():
    assert sorted(DEVICES) == sorted(DATASHEET)


# What CUDA (HIP) reports as the total, as published (GiB; topologies/devices.py's "Memory"
# names the sources); None: no reading found, the datasheet's decimal GB stand.
GIB = 2 ** 30
CUDA_TOTAL = {"a100-80gb-sxm": 79.25 * GIB, "a100-80gb-pcie": 79.25 * GIB,
              "a100-40gb-sxm": 42_298_834_944, "h100-sxm": 79.11 * GIB, "h100-pcie": 79.11 * GIB,
              "h100-nvl": None, "h200-sxm": 139.81 * GIB, "b200": 178.36 * GIB, "gb200": None,
              "mi300x": 191.98 * GIB}


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_device_matches_datasheet(name):
    peaks, hbm, mem, link, sms, watts = DATASHEET[name]
    spec = DEVICES[name]
    assert dict(spec.peak_flops) == pytest.approx(peaks, rel=1e-12)
    assert (spec.hbm_bandwidth, spec.nvlink_bandwidth) == pytest.approx((hbm, link), rel=1e-12)
    assert (spec.sm_count, spec.tdp_watts) == (sms, watts)


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_device_memory_is_what_cuda_reports(name):
    """memory_bytes is CUDA's total where a reading is published, else the datasheet's;
    a part sold as X GB has X GiB of HBM, of which the driver keeps a little: CUDA's
    total lies between X x 1e9 and X x 2^30."""
    marketed, spec = DATASHEET[name][2], DEVICES[name]
    reading = CUDA_TOTAL[name]
    if reading is None:
        assert spec.memory_bytes == marketed and spec.memory_source.startswith("datasheet")
        return
    assert spec.memory_bytes == pytest.approx(reading, rel=1e-12)
    assert marketed < spec.memory_bytes <= marketed / 1e9 * GIB
    assert "total" in spec.memory_source


def test_headline_conversions():
    assert get_device("b200").peak("bf16") == pytest.approx(2250 * T)
    assert get_device("gb200").peak("fp4") == pytest.approx(10_000 * T)
    assert get_device("gb200").nvlink_bandwidth == pytest.approx(130 * T / 72 / BIDIR, rel=0.01)
    assert get_device("gb200").memory_bytes == pytest.approx(13.4e12 / 72, rel=0.01)
    assert get_device("mi300x").nvlink_bandwidth == 448 * G
    assert get_device("b200").peak("float4_e2m1fn_x2") == get_device("b200").peak("fp4")
    with pytest.raises(TopologyError, match="'h100-sxm' has no peak FLOP/s for dtype 'fp4'"):
        get_device("h100").peak("fp4")


@pytest.mark.parametrize("name", sorted(MAMF))
def test_measured_matmul_ceiling_reproduces_the_mamf(name):
    spec = DEVICES[name]
    for dtype, tflops in MAMF[name].items():
        assert spec.achievable_flops(dtype) == pytest.approx(tflops * T, rel=1e-9)
        assert 0 < spec.matmul_ceiling[dtype] < 1
    assert spec.matmul_ceiling_source.startswith("ml-engineering MAMF v2")


def test_ceiling_values_and_fallbacks():
    a100 = get_device("a100")
    assert a100.matmul_ceiling_of("bf16") == pytest.approx(271.2 / 312)
    assert a100.matmul_ceiling_of("fp16") == a100.matmul_ceiling_of("bf16")  # fp16 -> bf16's
    assert a100.matmul_ceiling_of("tf32") is None and a100.achievable_flops("fp32") is None
    assert a100.hbm_ceiling == 0.88 and a100.achievable_hbm_bandwidth == pytest.approx(0.88 * 2039 * G)
    mi = get_device("mi300x")
    assert mi.matmul_ceiling["fp8"] == mi.matmul_ceiling["bf16"] and "assumed" in mi.matmul_ceiling_source
    with pytest.raises(TopologyError, match="no peak FLOP/s for dtype 'int4'"):
        a100.matmul_ceiling_of("int4")


@pytest.mark.parametrize("name, sibling", sorted(ASSUMED.items()))
def test_unmeasured_devices_borrow_a_sibling_and_say_so(name, sibling):
    spec, other = DEVICES[name], DEVICES[sibling]
    assert dict(spec.matmul_ceiling) == dict(other.matmul_ceiling)
    assert spec.matmul_ceiling_source.startswith(f"assumed as {sibling}")


def test_hbm_ceiling_measured_only_on_a100_and_h100_sxm():
    """The A100's published 1.80 of 2.04 TB/s; the H100 SXM's copy measured on a lent H100
    (3.01 of 3.35 TB/s, benchmarks/results/layer_gpu.md); every other device assumed."""
    measured = {"a100-80gb-sxm": 1.80 / 2.04, "h100-sxm": 3.011 / 3.35}
    for name, spec in DEVICES.items():
        assert spec.hbm_ceiling == pytest.approx(measured.get(name, 0.88), abs=0.003)
        assert ("assumed" in spec.hbm_ceiling_source) == (name not in measured)
    assert "layer_gpu.md" in DEVICES["h100-sxm"].hbm_ceiling_source


def test_device_spec_stays_backward_compatible_and_checks_new_fields():
    bare = DeviceSpec(name="x", peak_flops={"bf16": 1.0}, hbm_bandwidth=1.0, memory_bytes=1.0,
                      nvlink_bandwidth=1.0, sm_count=1)
    assert (dict(bare.matmul_ceiling), bare.hbm_ceiling, bare.achievable_flops("bf16")) == ({}, None, None)
    base = dict(name="x", peak_flops={"bf16": 1.0}, hbm_bandwidth=1.0, memory_bytes=1.0,
                nvlink_bandwidth=1.0, sm_count=1)
    for extra, message in (
        (dict(matmul_ceiling={"fp8": 0.5}, matmul_ceiling_source="s"), "matmul_ceiling key 'fp8' has no peak_flops"),
        (dict(matmul_ceiling={"bf16": 1.5}, matmul_ceiling_source="s"), r"matmul_ceiling\['bf16'\] must be a fraction"),
        (dict(matmul_ceiling={"bf16": 0.5}), "matmul_ceiling_source must name"),
        (dict(hbm_ceiling=0.0, hbm_ceiling_source="s"), "hbm_ceiling must be a fraction"),
        (dict(hbm_ceiling=0.9), "hbm_ceiling_source must name"),
        (dict(tdp_watts=-1), "tdp_watts must be a positive number"),
        (dict(compute_capability=(9,)), r"compute_capability must be \(major, minor\)"),
        (dict(matmul_best_shape={"bf16": (1, 2, 3)}), r"matmul_best_shape\['bf16'\] must be"),
        (dict(gemm_floor_s=-1.0), r"gemm_floor_s must be seconds"),
    ):
        with pytest.raises(TopologyError, match=f"device 'x': {message}"):
            DeviceSpec(**base, **extra)
    with pytest.raises(TypeError):
        DEVICES["b200"].matmul_ceiling["bf16"] = 1.0  # read-only


@pytest.mark.parametrize("alias, name", [
    ("H100-PCIe", "h100-pcie"), ("h100_nvl", "h100-nvl"), ("H100 NVL", "h100-nvl"), ("B200", "b200"),
    ("b200-sxm", "b200"), ("GB200", "gb200"), ("MI300X", "mi300x"), ("amd_mi300x", "mi300x"),
    ("A100-40GB", "a100-40gb-sxm"), ("a100-sxm4-40gb", "a100-40gb-sxm"), ("a100", "a100-80gb-sxm"),
    ("h200", "h200-sxm")])
def test_aliases(alias, name):
    assert get_device(alias).name == name


NVLINK5, NVLINK4 = 1.8 * T / BIDIR, 900 * G / BIDIR
GEN5 = 32e9 * 16 / 8  # PCIe Gen5: 32 GT/s x 16 lanes, bytes/s per direction


@pytest.mark.parametrize("kind, gpus, device, nvlink", [
    ("dgx-b200", 8, "b200", NVLINK5), ("hgx-b200", 8, "b200", NVLINK5),
    ("gb200-nvl72", 72, "gb200", NVLINK5), ("dgx-h100", 8, "h100-sxm", NVLINK4)])
def test_nvswitch_kinds(kind, gpus, device, nvlink):
    g = node(kind, nics=True)
    ids = gpu_nodes(g)
    assert len(ids) == gpus and {g.nodes[n]["device"] for n in ids} == {device}
    assert {g.nodes[n]["host"] for n in ids} == {0}
    for gpu in ids:
        assert g.edges[gpu, "nvswitch0"]["bandwidth"] == g.edges["nvswitch0", gpu]["bandwidth"] == nvlink
        assert g.edges[gpu, f"nic{gpu[3:]}"]["bandwidth"] == GEN5


def test_nvl72_every_pair_routes_over_nvlink_at_900e9():
    g = load_topology("gb200-nvl72")
    ids = gpu_nodes(g)
    assert len(ids) == 72 and g.graph["num_nodes"] == 1 and g.graph["gpus_per_node"] == 72
    for a, b in itertools.permutations(ids, 2):
        (path,) = routes(g, a, b)
        assert path == [a, "nvswitch0", b] and path_bandwidth(g, path) == 1.8e12 / 2
        assert {g.edges[u, v]["kind"] for u, v in zip(path, path[1:])} == {"nvlink"}
    # Grace CPUs: NVLink-C2C, 900 GB/s bidirectional per Grace shared by its 2 GPUs (assumed).
    assert g.edges["gpu0", "host0"] == {"bandwidth": 900e9 / BIDIR / 2, "latency": 1e-6, "kind": "nvlink-c2c"}


def test_mi300x_is_a_direct_infinity_fabric_mesh():
    g = load_topology("mi300x-8")
    ids = gpu_nodes(g)
    assert len(ids) == 8 and not any(a.get("type") == "switch" for _, a in g.nodes(data=True))
    for a, b in itertools.permutations(ids, 2):
        assert g.edges[a, b] == {"bandwidth": 128 * G / BIDIR, "latency": 1e-6, "kind": "xgmi"}
        assert routes(g, a, b) == [[a, b]]
    for gpu in ids:  # 7 links per GPU sum to the device's aggregate
        mesh = sum(d["bandwidth"] for _, v, d in g.out_edges(gpu, data=True) if d["kind"] == "xgmi")
        assert mesh == pytest.approx(get_device("mi300x").nvlink_bandwidth)
        assert g.edges[gpu, "host0"]["bandwidth"] == GEN5


def test_h100_nvl_pairs_are_bridged_and_the_rest_is_pcie():
    g = load_topology("pcie-h100-nvl")
    assert routes(g, "gpu0", "gpu1") == [["gpu0", "gpu1"]]
    assert path_bandwidth(g, ["gpu0", "gpu1"]) == 600 * G / BIDIR
    assert routes(g, "gpu0", "gpu2") == [["gpu0", "pcie0.0", "gpu2"]]
    assert path_bandwidth(g, routes(g, "gpu1", "gpu6")[0]) == GEN5
    h = node("pcie-h100")
    assert not h.has_edge("gpu0", "gpu1") and {h.nodes[n]["device"] for n in gpu_nodes(h)} == {"h100-pcie"}


def test_node_kind_rules_name_the_field():
    with pytest.raises(TopologyError, match="node kind 'x': gpu_switch must be one of nvswitch, pcie, mesh"):
        NodeKind("x", "b200", 8, "ring", GEN5)
    with pytest.raises(TopologyError, match="node kind 'x': gpu_switch 'mesh' needs a device with nvlink_bandwidth"):
        NodeKind("x", "a100-80gb-pcie", 8, "mesh", GEN5)
    with pytest.raises(TopologyError, match="node kind 'x': nvlink_pairs needs gpu_switch 'pcie'"):
        NodeKind("x", "b200", 8, "nvswitch", GEN5, nvlink_pairs=True)
    assert {"dgx-b200", "hgx-b200", "gb200-nvl72", "mi300x-8", "pcie-h100", "pcie-h100-nvl"} <= set(NODE_KINDS)


NEW_PRESETS = {"dgx-b200": 8, "gb200-nvl72": 72, "mi300x-8": 8, "pcie-h100-nvl": 8}


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_loads_and_validates(preset):
    g = load_topology(preset)
    validate_topology(g)
    assert g.graph["name"] == preset and g.graph.get("description")
    if preset in NEW_PRESETS:
        assert len(gpu_nodes(g)) == NEW_PRESETS[preset]


def test_cli_topologies_lists_devices():
    out = subprocess.run([sys.executable, "-c", "from clustersim.sim.cli import main; raise SystemExit(main())",
                          "topologies"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    for preset in NEW_PRESETS:
        assert preset in lines
    for name in DEVICES:
        assert name in lines
    assert lines["b200"].split()[1:6] == ["2250", "4500", "191.5", "8.00", "900"]
    assert "bf16 78%, fp8 76% [ml-engineering MAMF v2, B200 SXM]" in lines["b200"]
    assert "448 Infinity Fabric" in lines["mi300x"] and "none (PCIe)" in lines["a100-80gb-pcie"]
