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
