"""DP sub-group mapping (schedules.sharding, ClusterFacts, Plan.group), optimizer-step costs
(sim.optimizer_cost), offload."""
import pytest

from clustersim.schedules.data_parallel import ADAM_BYTES_PER_PARAM
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.sharding import group_ranks, shard_group_size
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.optimizer_cost import CPU_ADAM_SECONDS_PER_PARAM, optimizer_step_time
from clustersim.sim.simulate import simulate
from clustersim.topologies import get_device, load_topology

MODEL = get_model("llama3-8b", num_layers=4)


def test_shard_and_replicate_groups_tile_the_dp_group():
    parallel = ParallelConfig(dp=16, fsdp="hybrid", tp=2)
    topology = load_topology("dgx-h100-x16-ndr")
    facts = cluster_facts(topology)
    shard = shard_group_size(parallel, facts)
    assert shard == 4  # 8 GPUs per node / tp 2
    assert facts.dp_ranks_per_node(parallel) == 4
    dp = parallel.group("dp", 0)
    assert group_ranks(parallel, "dp_shard", dp[5], shard) == dp[4:8]
    assert group_ranks(parallel, "dp_replicate", dp[5], shard) == dp[1::4]
    plan = resolve(MODEL, parallel, facts)
    assert plan.dp_shard_size == shard
    assert plan.group("dp_shard", dp[5]) == dp[4:8]
    assert plan.group("dp_replicate", dp[5]) == dp[1::4]
    assert plan.group_size("dp_shard") == 4 and plan.group_size("dp_replicate") == 4
    with pytest.raises(ConfigError, match="dp_shard, or dp_replicate|unknown"):
        group_ranks(parallel, "dp_other", 0, shard)


def test_optimizer_step_costs():
    device = get_device("h100-sxm")
    op = Op(OpKind.OPT_STEP, 0, None, None, ADAM_BYTES_PER_PARAM * 10**9)
    assert optimizer_step_time(op, device, 0.8) == pytest.approx(28e9 / (device.hbm_bandwidth * 0.8))
    host = Op(OpKind.OPT_STEP, 0, None, "host", ADAM_BYTES_PER_PARAM * 10**9)
    assert optimizer_step_time(host, device, 0.8) == pytest.approx(10**9 * CPU_ADAM_SECONDS_PER_PARAM)


def test_offload_copies_over_pcie_and_steps_on_the_host():
    parallel = ParallelConfig(dp=8, num_microbatches=1, zero_stage=2, offload=True)
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100-x16-ndr"))
    mine = [s for s in timeline.spans if s.rank == 0]
    down = [s for s in mine if s.op.kind is OpKind.COPY_D2H]
    up = [s for s in mine if s.op.kind is OpKind.COPY_H2D]
    [step] = [s for s in mine if s.op.kind is OpKind.OPT_STEP]
    assert step.lane == "host" and all(s.lane == "pcie" for s in down + up)
    params = resolve(MODEL, parallel).stage_costs[0].grad_bytes // 2
    assert sum(s.op.nbytes for s in down) == pytest.approx(2 * params / 8, abs=64)
    # its 1/8 shard, with the 8 ranks of its host stepping on the host's CPU at once
    assert step.duration == pytest.approx(-(-params // 8) * 8 * CPU_ADAM_SECONDS_PER_PARAM)
    assert max(s.end for s in down) <= step.start and step.end <= min(s.start for s in up)
    gathers = [s for s in mine if s.op.kind is OpKind.ALL_GATHER]
    assert gathers and min(s.start for s in gathers) >= max(s.end for s in up)


def test_offload_without_host_cpus_in_the_topology_assumes_pcie_links_and_says_so():
    parallel = ParallelConfig(dp=8, num_microbatches=1, zero_stage=1, offload=True)
    topology = load_topology("dgx-h100")
    timeline = simulate(MODEL, parallel, topology)
    assert "host0" not in topology  # the caller's graph is left alone
    assert any("no host CPU nodes" in w and "64 GB/s" in w for w in timeline.meta["warnings"])
    [up] = [s for s in timeline.spans if s.rank == 0 and s.op.kind is OpKind.COPY_H2D]
    # one edge, at NCCL's 0.75 of the link (sim.link_capacity)
    assert up.duration == pytest.approx(1e-6 + up.op.nbytes / (0.75 * 64e9), rel=1e-6)


@pytest.mark.parametrize("dp", [1, 2, 8])
def test_the_gpus_of_a_host_share_its_cpu_adam(dp):
    """ZeRO-Offload steps Adam on the host CPU; every GPU of one host offloads to it at
    once, so the host steps all its ranks' shards together: each rank's step takes the
    whole model's parameters on that host x the CPU's seconds per parameter, whatever dp
    splits them into (issue 14, item 4: dp 8 used to be 8x faster per rank)."""
    model = get_model("gpt3-1.3b")
    parallel = ParallelConfig(dp=dp, zero_stage=1, offload=True, num_microbatches=2)
    timeline = simulate(model, parallel, load_topology("hgx-h100"))  # one host, 8 GPUs
    (step,) = [s for s in timeline.spans if s.rank == 0 and s.op.kind is OpKind.OPT_STEP]
    assert step.lane == "host"
    assert step.duration == pytest.approx(model.param_count() * CPU_ADAM_SECONDS_PER_PARAM,
                                          rel=1e-6)
