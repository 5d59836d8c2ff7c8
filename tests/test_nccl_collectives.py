"""Collectives as NCCL runs them (issue 22), against truths typed here from their sources:
NCCL 2.30.7's tuning tables (src/graph/tuning.cc) and link constants (src/graph/topo.h),
a hand trace of NCCL's tuner on 8x H100 (12 ring channels of 30 GB/s, 8 NVLS heads of
40 GB/s), the pipelined-ring and NVLS closed forms, and the maintainers' NIC figure."""
import subprocess
import sys

import pytest
import simpy

from clustersim.schedules.errors import ConfigError
from clustersim.sim import nccl_tuning as tuning
from clustersim.sim.collectives import collective_phases, run_collective, simulate_collective
from clustersim.sim.flows import FlowNetwork
from clustersim.sim.link_capacity import achievable_capacities
from clustersim.topologies import TopologyError, fat_tree, gpu_nodes, load_topology

H100_NVLINK = 18 * 20.6e9  # NCCL SM90_NVLINK_BW x 18 links, bytes/s per direction
A100_NVLINK = 12 * 20.0e9  # SM80_NVLINK_BW x 12 links
NDR_NIC = 48e9  # the maintainers' ~48 GB/s per 400 Gb/s NIC


def capacity(graph, u, v):
    return achievable_capacities(graph)[list(graph.edges).index((u, v))]


def test_link_capacities_are_nccls_figures():
    h100, a100 = load_topology("dgx-h100"), load_topology("dgx-a100")
    assert capacity(h100, "gpu0", "nvswitch0") == pytest.approx(H100_NVLINK)
    assert capacity(h100, "nvswitch0", "gpu3") == pytest.approx(H100_NVLINK)
    assert capacity(a100, "gpu0", "nvswitch0") == pytest.approx(A100_NVLINK)
    cluster = fat_tree("dgx-h100", 2, "ndr")
    assert capacity(cluster, "nic0", "leaf0") == pytest.approx(NDR_NIC)
    assert capacity(cluster, "gpu0", "nic0") == pytest.approx(64e9 * 12 / 16)  # Gen5: 24 Gb/s/lane
    # the graph keeps the line rate
    assert h100.edges["gpu0", "nvswitch0"]["bandwidth"] == 450e9


# --- NCCL's tuner, against the hand trace of 8x H100 -------------------------------------
H100_NODE = tuning.CommShape(8, 1, (9, 0), "nvlink", 30.0, float("inf"), 12,
                             nvls_channels=8, nvls=True, nvls_bw_intra=40.0)
HAND_TRACE = {  # (algorithm, protocol): (busBw GB/s, latency us), all-reduce, 8 ranks
    ("ring", "LL"): (141.0, 15.0), ("ring", "LL128"): (331.2, 40.6),
    ("ring", "Simple"): (360.0, 56.0), ("tree", "LL"): (87.2, 15.2),
    ("tree", "LL128"): (257.6, 31.5), ("tree", "Simple"): (331.2, 64.4),
    ("nvls", "Simple"): (476.0, 25.0),
}


@pytest.mark.parametrize("pair", sorted(HAND_TRACE))
def test_tuner_reproduces_the_hand_trace(pair):
    bus, lat = HAND_TRACE[pair]
    assert tuning.bus_bandwidth("all-reduce", *pair, H100_NODE) == pytest.approx(bus, abs=0.05)
    assert tuning.latency_us("all-reduce", *pair, H100_NODE) == pytest.approx(lat, abs=1e-9)
    ratio = 0.5 if pair[0] == "tree" else 8 / 14
    assert tuning.algorithm_bandwidth("all-reduce", *pair, H100_NODE) == pytest.approx(
        bus * ratio, abs=0.05)


def test_tuner_switches_from_ring_ll_to_nvls_at_the_crossover():
    # ring LL: 15.0 + S / (1000 x 141 x 8/14); NVLS: 25 + S / (1000 x 476 x 8/14); equal at
    crossover = 10.0 * 1000 / (1 / (141 * 8 / 14) - 1 / (476 * 8 / 14))
    below, above = int(crossover * 0.98), int(crossover * 1.02)
    assert tuning.choose("all-reduce", below, H100_NODE)[:2] == ("ring", "LL")
    assert tuning.choose("all-reduce", above, H100_NODE)[:2] == ("nvls", "Simple")
    assert tuning.choose("all-reduce", 1 << 30, H100_NODE)[:2] == ("nvls", "Simple")
    # forced: NCCL_ALGO=ring picks among the ring's protocols
    assert tuning.choose("all-reduce", 1 << 30, H100_NODE, "ring")[:2] == ("ring", "Simple")


def test_tuner_enablement_follows_nccl():
    assert not tuning.enabled("all-reduce", "nvls-tree", "Simple", H100_NODE)  # one node
    assert not tuning.enabled("all-reduce", "nvls", "LL", H100_NODE)  # NVLS: Simple only
    assert not tuning.enabled("broadcast", "tree", "LL", H100_NODE)  # rings only
    assert not tuning.enabled("all-reduce", "pat", "Simple", H100_NODE)
    assert tuning.enabled("all-gather", "pat", "Simple", tuning.CommShape(
        4, 4, (9, 0), "nvlink", 48.0, 48.0, 1))  # one GPU per node


# --- the simulated runs: closed forms ----------------------------------------------------
@pytest.mark.parametrize("size", [1 << 20, 1 << 30])
def test_pipelined_ring_closed_form(size):
    """Ring Simple on 8x H100: base + 2(n-1) x hwLat + 2(n-1)/n x S / B, NCCL's latency
    paid once per pipeline, B the achievable NVLink."""
    n = 8
    r = simulate_collective("all-reduce", size, n, "dgx-h100", "ring", "Simple")
    expected = (8.4 + 2 * (n - 1) * 3.4) * 1e-6 + 2 * (n - 1) / n * size / H100_NVLINK
    assert r.time_s == pytest.approx(expected, rel=1e-9)
    assert r.algorithm == "ring/Simple"


def test_ring_ll_runs_at_nccls_ll_ceiling():
    """LL sends a flag with every 8 bytes (half the bandwidth) and NCCL caps it at
    llMaxBw = 141 GB/s on one Hopper node: busbw 141 less the latency's share."""
    size, n = 1 << 24, 8
    r = simulate_collective("all-reduce", size, n, "dgx-h100", "ring", "LL")
    expected = (6.6 + 14 * 0.6) * 1e-6 + 2 * (n - 1) / n * size / 141e9
    assert r.time_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("size", [1 << 26, 1 << 33])
def test_nvls_reaches_the_switch_reduction_bound(size):
    """NVLS all-reduce moves S(1 + 1/n) out of and into each GPU (reduce in the switch,
    multicast back): busbw = 2(n-1)/(n+1) x B x nvlsEfficiency (0.85 on Hopper) once the
    25 us latency is paid."""
    n = 8
    r = simulate_collective("all-reduce", size, n, "dgx-h100", "nvls")
    t = 25e-6 + size * (1 + 1 / n) / (H100_NVLINK * 0.85)
    assert r.time_s == pytest.approx(t, rel=1e-9)
    bound = 2 * (n - 1) / (n + 1) * H100_NVLINK * 0.85
    assert r.busbw < bound
    if size > 1 << 30:  # the latency is 0.08% of 8 GiB's time
        assert r.busbw > 0.999 * bound


def test_two_node_ring_runs_at_the_nics():
    """NCCL_ALGO=ring across 2 DGX H100: each channel leaves a host through its own NIC,
    so busbw approaches 8 NICs x 48 GB/s (the maintainers' ~396 GB/s 'with the RING
    protocol', nccl-tests issue 319)."""
    graph = fat_tree("dgx-h100", 2, "ndr")
    r = simulate_collective("all-reduce", 1 << 33, 16, graph, "ring", "Simple")
    assert r.busbw == pytest.approx(8 * NDR_NIC, rel=0.01)
    assert r.busbw < 8 * NDR_NIC


def test_default_is_nccls_choice_on_cuda_and_alpha_beta_elsewhere():
    h100 = load_topology("dgx-h100")
    name, _ = collective_phases("all-reduce", gpu_nodes(h100), 1 << 30, h100)
    assert name == "nvls/Simple"
    mi300 = load_topology("mi300x-8")
    name, phases = collective_phases("all-reduce", gpu_nodes(mi300), 1 << 30, mi300)
    assert "/" not in name and all(p.latency is None for p in phases)


@pytest.mark.parametrize("argv, message", [
    (["--protocol", "LL7"], "protocol must be one of LL, LL128, Simple"),
    (["--algorithm", "nvls", "--topology", "dgx-a100"], "NVLS needs SM90+"),
    (["--algorithm", "nvls", "--protocol", "LL"], "runs nvls with Simple only"),
])
def test_cli_refuses_what_nccl_does_not_run(argv, message):
    out = subprocess.run([sys.executable, "-m", "clustersim", "collective",
                          "all-reduce", "--size", "1M", "--ranks", "8", *argv],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and message in out.stderr


@pytest.mark.parametrize("hosts, latency_us", [
    (1, 6.8 + 2 * 7 * 0.6),  # baseLat + 2 (ppn - 1) NVLink hwLat
    (2, 6.8 + 2 * (7 * 0.6 + 1 * 5.0)),  # + 2 log2(nodes) net hwLat
])
def test_tree_ll_pays_nccls_published_tree_latency(hosts, latency_us):
    """NCCL's tree all-reduce latency, 2((ppn-1) intraLat + log2(nodes) interLat) over
    baseLat, for LL (tuning.cc); an 8-byte message adds next to nothing to it."""
    graph = load_topology("dgx-h100") if hosts == 1 else fat_tree("dgx-h100", hosts, "ndr")
    r = simulate_collective("all-reduce", 8, 8 * hosts, graph, "tree", "LL")
    assert r.algorithm == "tree/LL"
    assert r.time_s == pytest.approx(latency_us * 1e-6, rel=1e-3)
    assert r.time_s > latency_us * 1e-6


def test_pat_all_gather_with_one_gpu_per_node():
    """One GPU on each of 8 DGX H100 (a data-parallel group of a tp 8 job): NCCL enables
    PAT. Its latency: baseLat 8 + log2(8) x net tree hwLat 14 / 3.5 + 8 x 2.8 us; its
    bytes: n - 1 chunks of S/n out of each NIC at 0.75 of 48 GB/s (PAT's share)."""
    graph = fat_tree("dgx-h100", 8, "ndr")
    members = gpu_nodes(graph)[::8]
    size = 1 << 26
    name, (phase,) = collective_phases("all-gather", members, size, graph, "pat")
    assert name == "pat/Simple"
    sent = {g: sum(b for a, _, b in phase.flows if a == g) for g in members}
    assert list(sent.values()) == [pytest.approx(7 / 8 * size / 0.75)] * 8
    env = simpy.Environment()
    done = run_collective(env, FlowNetwork(env, graph), "all-gather", members, size, "pat")
    env.run()
    latency = (8.0 + 3 * 14.0 / 3.5 + 8 * 2.8) * 1e-6
    assert done.value.time_s == pytest.approx(latency + 7 / 8 * size / (0.75 * NDR_NIC),
                                              rel=1e-9)
    # NCCL's tuner, 1 KiB: ring LL 6.6 + 7 x 5.0 = 41.6 us beats PAT's 42.4 on 8 nodes;
    # on 16, PAT's 8 + 4 x 4 + 16 x 2.8 = 68.8 beats the ring's 6.6 + 15 x 5.0 = 81.6
    assert collective_phases("all-gather", members, 1 << 10, graph)[0] == "ring/LL"
    wider = fat_tree("dgx-h100", 16, "ndr")
    one_each = gpu_nodes(wider)[::8]
    assert collective_phases("all-gather", one_each, 1 << 10, wider)[0] == "pat/Simple"
    assert collective_phases("all-gather", one_each, 1 << 30, wider)[0].startswith("ring/")


def test_collnet_chain_through_sharp():
    """CollNet chain on 8 DGX H100 with SHARP: g chains of S/g per host, each GPU head of
    one; a GPU sends (2g - 2)/g S through its NVLink (up and down the chains), its NIC
    S/g each way at NCCL's CollNet share 0.5 of the NIC (algbw = channels x bw x 0.5,
    tuning.cc), so the NICs bound it: S / (g x 0.5 x 48 GB/s) = S / 192 GB/s, above the
    NVLink's 1.75 S / 370.8 GB/s. NCCL's latency: 2 (ppn-1) x 2.8 + 30 us (NVLink and net
    hwLat of CollNet chain, Simple). Only when asked for: NCCL's default leaves CollNet
    off (NCCL_COLLNET_ENABLE=0)."""
    graph = fat_tree("dgx-h100", 8, "ndr", in_network_reduction=True)
    size, g = 1 << 30, 8
    r = simulate_collective("all-reduce", size, 64, graph, "collnet-chain")
    latency = (2 * 7 * 2.8 + 30.0) * 1e-6
    assert size / g / (0.5 * NDR_NIC) > (2 * g - 2) / g * size / H100_NVLINK
    assert r.time_s == pytest.approx(latency + size / g / (0.5 * NDR_NIC), rel=1e-9)
    assert simulate_collective("all-reduce", size, 64, graph).algorithm == "nvls-tree/Simple"
    with pytest.raises(ConfigError, match="in_network_reduction"):
        simulate_collective("all-reduce", size, 64, fat_tree("dgx-h100", 8, "ndr"),
                            "collnet-chain")
    with pytest.raises(TopologyError, match="in_network_reduction must be true or false"):
        fat_tree("dgx-h100", 2, "ndr", in_network_reduction="yes")


def test_nvls_tree_runs_at_nccls_per_channel_ceiling():
    """2 DGX H100, NVLS-tree: NCCL caps its bus bandwidth at channels x perChMaxNVLSTreeBw
    (8 x 57.7 GB/s, Hopper, 2 nodes), below NVLS's 0.85 of the NVLink; its latency is
    NVLS's 25 us + 2 log2(2) x net hwLat 20.9 us. The trees' NIC flows (S/8 each way per
    GPU at 48 GB/s) are not the bottleneck."""
    size, n = 1 << 33, 16
    r = simulate_collective("all-reduce", size, n, fat_tree("dgx-h100", 2, "ndr"))
    assert r.algorithm == "nvls-tree/Simple"
    latency = (25 + 2 * 1 * 20.9) * 1e-6
    assert r.time_s == pytest.approx(latency + 2 * (n - 1) / n * size / (8 * 57.7e9), rel=1e-9)
