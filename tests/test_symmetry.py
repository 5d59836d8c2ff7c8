"""The replay's symmetry (issue 14, item 7; issue 19): one slow NIC of the job would be
ignored by a replay of one replica, so the symmetric replay refuses it and the default
replays every rank; a GPU of another device is refused by both (compute is costed per
stage)."""
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.parallel import ParallelConfig
from clustersim.sim.simulate import simulate
from clustersim.sim.world import Replaying
from clustersim.topologies import fat_tree

GPT = get_model("gpt3-1.3b", num_layers=4)
PARALLEL = ParallelConfig(dp=16, num_microbatches=1)


def test_every_gpu_of_the_job_must_be_the_same_device():
    graph = fat_tree("dgx-h100", num_nodes=2)
    graph.nodes["gpu11"]["device"] = "a100-80gb-sxm"
    for mode in ("auto", "all"):
        with pytest.raises(ConfigError, match="gpu11 is a a100-80gb-sxm, gpu0 a h100-sxm: "
                                              "compute is costed on each pipeline stage's"):
            simulate(GPT, PARALLEL, graph, replaying=Replaying(mode))


def test_a_slow_nic_is_refused_naming_it():
    graph = fat_tree("dgx-h100", num_nodes=2)
    for edge in (("gpu9", "nic9"), ("nic9", "gpu9")):
        graph.edges[edge]["bandwidth"] /= 4
    with pytest.raises(ConfigError, match="replay='symmetric' replays one pipeline replica, "
                                          "but (gpu9|nic9)'s links differ"):
        simulate(GPT, PARALLEL, graph, replaying=Replaying("symmetric"))
    timeline = simulate(GPT, PARALLEL, graph)  # auto: every rank, saying why
    assert timeline.meta["replayed"].startswith("all 16 GPUs replayed op by op")
    assert any("every rank replayed because" in w and "links differ" in w
               for w in timeline.meta["warnings"])


def test_a_symmetric_cluster_and_what_the_job_does_not_use_are_fine():
    graph = fat_tree("dgx-h100", num_nodes=2)
    simulate(GPT, PARALLEL, graph)
    graph.nodes["gpu15"]["device"] = "a100-80gb-sxm"  # outside a job of 8 GPUs
    simulate(GPT, ParallelConfig(dp=8, num_microbatches=1), graph)


def test_every_run_says_what_it_replayed():
    timeline = simulate(GPT, ParallelConfig(pp=2, dp=8, num_microbatches=2),
                        fat_tree("dgx-h100", num_nodes=2))
    assert timeline.meta["replayed"].startswith("2 of 16 GPUs replayed op by op")
    assert "the other 14 assumed identical" in timeline.meta["replayed"]


def test_replicas_placed_on_hosts_unlike_the_replayed_one_are_replayed():
    """pp 4 x dp 3 on two 8-GPU hosts (ranks dp-fastest: replica d holds GPUs d, d+3, d+6,
    d+9): replica 0's pipeline changes host after stage 2 (GPUs 6 -> 9), replica 2's after
    stage 1 (5 -> 8), so one replayed replica stands for none of them: the symmetric replay
    refuses, the default replays every rank and says why."""
    graph = fat_tree("dgx-h100", num_nodes=2)
    parallel = ParallelConfig(pp=4, dp=3, num_microbatches=4)
    with pytest.raises(ConfigError, match=r"the pipeline of rank 2 changes host after stages "
                                          r"\[1\], the replayed one after \[2\]"):
        simulate(GPT, parallel, graph, replaying=Replaying("symmetric"))
    timeline = simulate(GPT, parallel, graph)
    assert timeline.meta["replayed"].startswith("all 12 GPUs replayed op by op")
    assert any("every rank replayed because the pipeline of rank 2" in w
               for w in timeline.meta["warnings"])


def test_a_group_split_over_hosts_unlike_the_replayed_ones_is_replayed():
    """tp 3 x dp 4 on two 8-GPU hosts (tp fastest): the tp groups of GPUs 0-2 and 3-5 sit
    on host 0 and 9-11 on host 1, but 6-8 split 2 + 1 over both, so its TP collectives
    cross the network where the replayed group's do not; tp 2 x dp 4 splits no group."""
    graph = fat_tree("dgx-h100", num_nodes=2)
    model = get_model("gpt3-1.3b", num_layers=4, num_attention_heads=12, hidden_size=1536)
    parallel = ParallelConfig(tp=3, dp=4, num_microbatches=1)
    with pytest.raises(ConfigError, match=r"rank 6's tp group has \[1, 2\] GPUs per host, "
                                          r"the replayed rank 0's \[3\]"):
        simulate(model, parallel, graph, replaying=Replaying("symmetric"))
    even = simulate(model, ParallelConfig(tp=2, dp=4, num_microbatches=1), graph)
    assert even.meta["replayed"].startswith("1 of 8 GPUs replayed op by op")
