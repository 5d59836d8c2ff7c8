"""simulate(): placement on the topology and what the network costs the pipeline."""
import pytest

from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.simulate import simulate
from clustersim.topologies import fat_tree, host_of, path_bandwidth, path_latency, route

MODEL = get_model("gpt3-1.3b")
BOUNDARY = MODEL.micro_batch_size * MODEL.seq_length * MODEL.hidden_size * 2  # bf16 bytes


def plan_on(parallel, topology):
    return resolve(MODEL, parallel, cluster_facts(topology))


def test_megatron_order_puts_pipeline_stages_dp_ranks_apart():
    graph = fat_tree("dgx-h100", num_nodes=2)
    devices = list(plan_on(ParallelConfig(pp=2, dp=8, num_microbatches=4), graph).devices)
    assert devices == ["gpu0", "gpu8"]
    assert host_of(graph, "gpu0") != host_of(graph, "gpu8")


def test_cross_node_pipeline_pays_the_inter_node_link():
    graph = fat_tree("dgx-h100", num_nodes=2)
    parallel = ParallelConfig(pp=2, dp=8, num_microbatches=4)
    timeline = simulate(MODEL, parallel, graph)
    path = route(graph, "gpu0", "gpu8")
    assert any(graph.nodes[n]["type"] == "nic" for n in path)
    assert path_bandwidth(graph, path) == 50e9  # NDR is the narrowest line rate
    # achievable: 48 GB/s, the NIC's and PCIe Gen5's both (sim.link_capacity)
    expected = path_latency(graph, path) + BOUNDARY / 48e9
    sends = [s for s in timeline.spans if s.op.kind in (OpKind.SEND_F, OpKind.SEND_B)]
    assert len(sends) == 2 * 4
    for span in sends:  # one transfer at a time crosses the boundary: no contention
        assert span.duration == pytest.approx(expected, rel=1e-9)

    same_node = simulate(MODEL, ParallelConfig(pp=2, num_microbatches=4), graph)
    fast = [s for s in same_node.spans if s.op.kind is OpKind.SEND_F][0]
    assert fast.duration < sends[0].duration / 5  # NVLink 450 GB/s vs NDR 50 GB/s


def test_tp_group_spanning_nodes_is_reported():
    graph = fat_tree("dgx-h100", num_nodes=2)
    model = get_model("gpt3-1.3b")
    inside = plan_on(ParallelConfig(tp=8, pp=2, num_microbatches=2), graph)
    assert inside.groups_spanning_hosts("tp") == []
    spanning = plan_on(ParallelConfig(tp=16, num_microbatches=1), graph)
    assert spanning.groups_spanning_hosts("tp") == [list(range(16))]
    timeline = simulate(model, ParallelConfig(tp=16, num_microbatches=1), graph)
    assert any("TP group" in w for w in timeline.meta["warnings"])


def test_dp_gradient_allreduce_follows_the_ring_closed_form():
    """pp=1, dp=2 on one NVSwitch node: after the last backward, one all-reduce of the
    gradients as NCCL runs it, a ring Simple: its latency, baseLat 8.4 us + 2(n-1) x NVLink
    hwLat 3.4 us (NCCL 2.30.7's tables), + 2(n-1)/n * S/B with n = 2 and B the H100's
    achievable NVLink, 18 x 20.6 GB/s (one bucket holding every gradient: DDP's bucketing
    is tested in test_data_parallel)."""
    graph = fat_tree("dgx-h100", num_nodes=1)
    parallel = ParallelConfig(dp=2, num_microbatches=2, bucket_bytes=1 << 50)
    timeline = simulate(MODEL, parallel, graph)
    reduce = [s for s in timeline.spans if s.op.kind is OpKind.ALL_REDUCE]
    assert len(reduce) == 1 and reduce[0].lane == "dp"
    grad_bytes = MODEL.param_count() * 2  # bf16 gradients
    assert reduce[0].op.nbytes == grad_bytes
    latency = (8.4 + 2 * 3.4) * 1e-6
    assert reduce[0].duration == pytest.approx(latency + grad_bytes / (18 * 20.6e9), rel=1e-9)
    last_backward = max(s.end for s in timeline.spans if s.op.kind is OpKind.B)
    assert reduce[0].start == pytest.approx(last_backward)
    assert reduce[0].info["algorithm"] == "ring/Simple"


def test_collectives_of_one_rank_run_in_issue_order():
    parallel = ParallelConfig(pp=2, vpp=2, dp=2, num_microbatches=4, schedule="interleaved-1f1b",
                              bucket_bytes=1 << 50)  # one bucket per stage
    timeline = simulate(get_model("gpt3-1.3b"), parallel, fat_tree("dgx-h100", num_nodes=1))
    for rank in (0, 1):
        mine = sorted((s for s in timeline.spans
                       if s.rank == rank and s.op.kind is OpKind.ALL_REDUCE),
                      key=lambda s: s.start)
        assert [s.op.stage for s in mine] == [rank + 2, rank]  # chunk 1's backward ends first
        assert mine[0].end <= mine[1].start


def test_bubble_is_time_with_nothing_in_flight_and_communication_is_beside_it():
    """pp = 1: no pipeline, so no bubble; the blocking TP all-reduces are exposed
    communication, reported beside the bubble (issue 14, item 8: it used to say 21.9%
    bubble while the breakdown showed none)."""
    parallel = ParallelConfig(pp=1, tp=8, num_microbatches=2)
    timeline = simulate(get_model("llama3-8b"), parallel, fat_tree("dgx-h100", num_nodes=1))
    (row,) = timeline.time_breakdown().values()
    assert timeline.bubble_fraction == 0.0 and row["bubble"] == 0.0
    assert row["tp"] > 0
    assert timeline.exposed_comm_fraction == pytest.approx(row["tp"] / timeline.iteration_time)
    assert row["compute"] + row["tp"] == pytest.approx(timeline.iteration_time)
