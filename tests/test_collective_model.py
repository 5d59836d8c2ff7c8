"""sim.collective_model: intra-node TP collectives at their uncontended time (cached),
groups across nodes as flows; a TP group split over two nodes is slower."""
import pytest
import simpy

from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.collective_model import collective_model
from clustersim.sim.collectives import run_collective
from clustersim.sim.flows import FlowNetwork
from clustersim.sim.simulate import simulate
from clustersim.topologies import fat_tree

GPT = get_model("gpt3-1.3b")


def plan_on(parallel, graph):
    return resolve(GPT, parallel, cluster_facts(graph))


@pytest.mark.parametrize("kind", [OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER])
def test_cached_intra_node_time_equals_the_flow_simulation(kind):
    """On one NVSwitch node, k back-to-back ring collectives: the cached alpha-beta time
    equals k runs of the flows, k * (steps * alpha + bytes / bandwidth)."""
    graph = fat_tree("dgx-h100", num_nodes=1)
    parallel = ParallelConfig(tp=8, num_microbatches=1)
    op = Op(kind, 0, 0, "tp", nbytes=6 * (64 << 20), count=6)
    env = simpy.Environment()
    network = FlowNetwork(env, graph)
    done = collective_model(env, network, plan_on(parallel, graph))(op, 0)
    env.run()
    cached = env.now
    assert done.value["model"].startswith("uncontended")

    env = simpy.Environment()
    network = FlowNetwork(env, graph)
    gpus = [f"gpu{i}" for i in range(8)]
    single = Op(kind, 0, 0, "tp", nbytes=64 << 20)
    for _ in range(6):
        run_collective(env, network, single, gpus, algorithm=done.value["algorithm"])
        env.run()
    assert cached == pytest.approx(env.now, rel=1e-9)


def test_tp_group_across_two_nodes_is_slower_than_inside_one():
    """Same job, tp=8 x dp=2 on two DGX H100 nodes: Megatron's order keeps each TP group
    in a node (NVLink); dp innermost strides TP over both nodes (NDR 50 GB/s per GPU)."""
    graph = fat_tree("dgx-h100", num_nodes=2)
    inside = ParallelConfig(tp=8, dp=2, num_microbatches=2)
    across = ParallelConfig(tp=8, dp=2, num_microbatches=2, rank_order="dp-tp-cp-ep-pp")
    assert plan_on(inside, graph).groups_spanning_hosts("tp") == []
    assert plan_on(across, graph).groups_spanning_hosts("tp")
    fast, slow = simulate(GPT, inside, graph), simulate(GPT, across, graph)

    def tp_time(timeline):
        return sum(s.duration for s in timeline.spans if s.lane == "tp" and s.rank == 0)

    assert tp_time(slow) > 1.5 * tp_time(fast)  # 4 NICs x 50 GB/s vs NVLink
    # most TP collectives block the next compute: most of the extra TP time shows
    assert slow.iteration_time - fast.iteration_time > 0.5 * (tp_time(slow) - tp_time(fast))
    crossing = [s for s in slow.spans if s.lane == "tp"]
    assert all(not (s.info or {}).get("model") for s in crossing)  # flows, not cached


def test_next_compute_waits_for_tp_collectives_unless_overlapped():
    """Blocking TP collectives (SP all-gathers and reduce-scatters) sit on the critical
    path: compute + TP time; with --tp-comm-overlap most run alongside the compute and the
    iteration is shorter (tests/test_tp_overlap.py: by how much)."""
    from dataclasses import replace

    graph = fat_tree("dgx-h100", num_nodes=1)
    parallel = ParallelConfig(tp=8, sequence_parallel=True, num_microbatches=2)
    blocking = simulate(GPT, parallel, graph)
    overlapped = simulate(GPT, replace(parallel, tp_comm_overlap=True), graph)
    compute = [s for s in blocking.spans if s.rank == 0 and s.lane == "compute"]
    tp = [s for s in blocking.spans if s.rank == 0 and s.lane == "tp"]
    for prev, nxt in zip(compute, compute[1:]):
        between = [s for s in tp if prev.end <= s.start < nxt.start]
        assert between and nxt.start >= max(s.end for s in between) - 1e-15
    assert overlapped.iteration_time < blocking.iteration_time


def test_peer_groups_on_links_of_their_own_are_not_run():
    """tp=8 strided over two nodes (dp innermost): replica 1's TP group shares replica 0's
    hosts but, on a DGX's rails and a non-blocking fat-tree, no link, so it cannot slow
    replica 0's collective down and is not simulated: the span and the flow count are those
    of replica 0's group alone."""
    graph = fat_tree("dgx-h100", num_nodes=2)
    parallel = ParallelConfig(tp=8, dp=2, num_microbatches=1, rank_order="dp-tp-cp-ep-pp")
    env = simpy.Environment()
    network = FlowNetwork(env, graph)
    op = Op(OpKind.ALL_REDUCE, 0, 0, "tp", nbytes=64 << 20)
    start = env.now
    done = collective_model(env, network, plan_on(parallel, graph))(op, 0)
    env.run()
    alone = FlowNetwork(simpy.Environment(), graph)
    run = run_collective(alone.env, alone, op, [f"gpu{i}" for i in range(0, 16, 2)],
                         algorithm=done.value["algorithm"])
    alone.env.run()
    assert network.completed_flows == alone.completed_flows > 0
    assert env.now - start == pytest.approx(run.value.spans[0].end, rel=1e-12)


def test_the_other_tp_ranks_dp_groups_load_the_links_they_share():
    """pcie-a100, tp 2, dp 4: the DP rings of both TP ranks (GPUs 0,2,4,6 and 1,3,5,7) cross
    the host CPU between the two PCIe switches at once; the replayed DP all-reduce takes as
    long as a flow-level run of both rings together, not as one ring alone (issue 14,
    item 7: it used to take half)."""
    import simpy

    from clustersim.sim.collectives import run_collective
    from clustersim.sim.flows import FlowNetwork
    from clustersim.sim.simulate import simulate
    from clustersim.topologies import load_topology

    graph = load_topology("pcie-a100")
    parallel = ParallelConfig(tp=2, dp=4, num_microbatches=2, bucket_bytes=1 << 40,
                              overlap_grad_reduce=False)  # one bucket: one all-reduce
    timeline = simulate(GPT, parallel, graph)
    (replayed,) = [s for s in timeline.spans if s.rank == 0 and s.lane == "dp"]
    env = simpy.Environment()
    network = FlowNetwork(env, graph)
    runs = [run_collective(env, network, replayed.op, [f"gpu{g}" for g in ring])
            for ring in ([0, 2, 4, 6], [1, 3, 5, 7])]
    env.run()
    both = max(run.value.spans[0].end for run in runs)
    assert replayed.duration == pytest.approx(both, rel=0.10)
    env = simpy.Environment()
    alone = run_collective(env, FlowNetwork(env, graph), replayed.op, ["gpu0", "gpu2", "gpu4",
                                                                       "gpu6"])
    env.run()
    assert replayed.duration > 1.5 * alone.value.spans[0].end
