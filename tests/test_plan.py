"""The Plan: the facts of one run, resolved once (schedules.plan), checked against the
rules they come from: Megatron-Core's pipeline split by placement, the rank grid, the
shard group of the nodes, and the one replica the simulator replays."""
import pytest

from clustersim.schedules.cluster_facts import ClusterFacts
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import header_line, resolve
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.sharding import state_shard_degree

GPT = get_model("gpt3-1.3b")  # 24 layers


def cluster(nodes: int, per_node: int = 8) -> ClusterFacts:
    gpus = tuple(f"gpu{i}" for i in range(nodes * per_node))
    return ClusterFacts("test", gpus, tuple(i // per_node for i in range(len(gpus))),
                        "h100-sxm", 80e9)


def v_schedule(pp: int, microbatches: int) -> Schedule:
    """Two chunks per rank in a V (rank r holds stages r and 2P-1-r), GPipe order."""
    stages = 2 * pp
    ranks = tuple(s if s < pp else stages - 1 - s for s in range(stages))
    programs = [[Op(kind, s, m) for kind in (OpKind.F, OpKind.B)
                 for s in (range(stages) if kind is OpKind.F else reversed(range(stages)))
                 if ranks[s] == r for m in range(microbatches)] for r in range(pp)]
    return Schedule("v-test", microbatches, programs, stages, ranks)


def test_a_registered_schedule_is_placed_and_split_without_building_it():
    plan = resolve(GPT, ParallelConfig(pp=4, vpp=2, schedule="interleaved-1f1b",
                                       num_microbatches=8))
    assert plan.stage_ranks == (0, 1, 2, 3, 0, 1, 2, 3) and plan.placement == "loop"
    assert plan.stage_layers == (3,) * 8 and plan.stage_offsets == tuple(range(0, 24, 3))
    assert plan.stages_of(1) == [1, 5] and plan.stages_per_rank == 2
    assert plan.build_schedule().stage_ranks == plan.stage_ranks


def test_uneven_split_follows_the_placement_of_a_v_schedule():
    """Megatron-Core's --decoder-first/last-pipeline-num-layers are per pipeline RANK: with
    a V, rank 0 holds the first and the last stage, so both get the first rank's share."""
    parallel = ParallelConfig(pp=2, vpp=2, num_microbatches=2, first_stage_layers=4,
                              last_stage_layers=20, schedule="custom")
    plan = resolve(GPT, parallel, schedule=v_schedule(2, 2))
    assert plan.stage_ranks == (0, 1, 1, 0) and plan.placement == "v"
    assert plan.stage_layers == (2, 10, 10, 2)  # rank 0: 4 layers over its 2 stages


def test_groups_follow_the_rank_grid():
    """Megatron's order tp-cp-ep-dp-pp: TP neighbours consecutive, PP farthest apart."""
    plan = resolve(GPT, ParallelConfig(tp=2, dp=4, pp=2, num_microbatches=2))
    assert plan.group("tp", 0) == [0, 1] and plan.group("dp", 0) == [0, 2, 4, 6]
    assert plan.group("pp", 3) == [3, 11] and plan.group_size("dp") == 4
    assert plan.replayed_ranks == (0, 8) and plan.world_size == 16


def test_cached_groups_and_stages_are_copies_and_refuse_bad_ranks_every_time():
    """Plan keeps each group and each rank's stages once (the planner asks for them per
    op): what it hands out is a copy, and a bad rank is refused on every call."""
    plan = resolve(GPT, ParallelConfig(tp=2, dp=4, pp=2, vpp=2, schedule="interleaved-1f1b",
                                       num_microbatches=4))
    plan.group("dp", 0).append(99)
    plan.stages_of(1).append(99)
    assert plan.group("dp", 0) == [0, 2, 4, 6] and plan.stages_of(1) == [1, 3]
    assert plan.stages_of(5) == []
    for _ in range(2):
        with pytest.raises(ConfigError, match="out of range"):
            plan.group("dp", 16)
    with pytest.raises(ConfigError, match="out of range"):
        plan.group("dp", True)


def test_the_shard_group_is_the_dp_ranks_on_one_node():
    """HSDP shards inside a node: with tp=2 on 8-GPU nodes a node holds 4 dp ranks."""
    parallel = ParallelConfig(tp=2, dp=8, fsdp="hybrid", num_microbatches=1)
    plan = resolve(GPT, parallel, cluster(nodes=2))
    assert plan.dp_shard_size == 4 and plan.comm_shards == 4
    assert state_shard_degree(parallel, plan.dp_shard_size) == 4  # N of the ZeRO formulas
    assert plan.group("dp_shard", 0) == [0, 2, 4, 6]
    assert plan.group("dp_replicate", 0) == [0, 8]
    given = resolve(GPT, ParallelConfig(tp=2, dp=8, fsdp="hybrid", shard_size=2,
                                        num_microbatches=1))
    assert given.dp_shard_size == 2  # as given; no cluster needed


def test_devices_need_a_gpu_for_every_rank():
    plan = resolve(GPT, ParallelConfig(pp=2, dp=8, num_microbatches=2), cluster(nodes=2))
    assert plan.devices == ("gpu0", "gpu8")
    small = resolve(GPT, ParallelConfig(pp=2, dp=8, num_microbatches=2), cluster(nodes=1))
    with pytest.raises(ConfigError, match="needs 16 GPUs"):
        small.devices


def test_groups_spanning_hosts():
    plan = resolve(GPT, ParallelConfig(tp=16, num_microbatches=1), cluster(nodes=2))
    assert plan.groups_spanning_hosts("tp") == [list(range(16))]
    assert resolve(GPT, ParallelConfig(tp=8, pp=2, num_microbatches=1),
                   cluster(nodes=2)).groups_spanning_hosts("tp") == []


@pytest.mark.parametrize("parallel, schedule, message", [
    (ParallelConfig(pp=2, num_microbatches=2), v_schedule(4, 2), "has 4 ranks, pp is 2"),
    (ParallelConfig(pp=2, num_microbatches=3), v_schedule(2, 2), "has 2 microbatches"),
    (ParallelConfig(pp=5, num_microbatches=5), None, "num_layers=24 is not divisible"),
    (ParallelConfig(tp=3, num_microbatches=1), None, "num_attention_heads=16"),
])
def test_resolve_refuses_what_cannot_run(parallel, schedule, message):
    with pytest.raises(ConfigError, match=message):
        resolve(GPT, parallel, schedule=schedule)


def test_described_plan_and_header():
    plan = resolve(GPT, ParallelConfig(pp=2, dp=2, num_microbatches=4), cluster(nodes=1))
    d = plan.describe()
    assert (d["schedule"], d["pp"], d["dp"], d["stage_layers"], d["devices"]) == (
        "1f1b", 2, 2, [12, 12], ["gpu0", "gpu2"])
    assert d["replayed_ranks"] == [0, 2] and d["world_size"] == 4
    assert header_line(d) == plan.header() == (
        "1f1b: pp=2 vpp=1 dp=2 microbatches=4 mbs=1 model=gpt3-1.3b topology=test")


def test_a_schedule_given_as_data_is_never_replaced_by_a_registered_one():
    """A GPipe program table that happens to be named like a registered schedule: the plan
    keeps its shape and builds no other schedule in its place."""
    from clustersim.schedules.memory_model import rank_memory
    from clustersim.schedules.registry import build_schedule

    data = build_schedule("gpipe", 4, 8)
    data.name = "1f1b"
    plan = resolve(GPT, ParallelConfig(pp=4, num_microbatches=8, schedule="custom"),
                   schedule=data)
    assert not plan.registered and plan.placement == "loop"
    with pytest.raises(ConfigError, match="given as data"):
        plan.build_schedule()
    assert [r.in_flight for r in rank_memory(plan, schedule=data)] == [8, 8, 8, 8]  # GPipe: M
