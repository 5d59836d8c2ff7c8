"""The replay's symmetry, refused where the topology breaks it (issue 14, item 7): one slow
GPU or one slow NIC of the job would be ignored by a replay of one replica."""
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.parallel import ParallelConfig
from clustersim.sim.simulate import simulate
from clustersim.topologies import fat_tree

GPT = get_model("gpt3-1.3b", num_layers=4)
PARALLEL = ParallelConfig(dp=16, num_microbatches=1)


def test_every_gpu_of_the_job_must_be_the_same_device():
    graph = fat_tree("dgx-h100", num_nodes=2)
    graph.nodes["gpu11"]["device"] = "a100-80gb-sxm"
    with pytest.raises(ConfigError, match="gpu11 is a a100-80gb-sxm.*assumes every rank"):
        simulate(GPT, PARALLEL, graph)


def test_a_slow_nic_is_refused_naming_it():
    graph = fat_tree("dgx-h100", num_nodes=2)
    for edge in (("gpu9", "nic9"), ("nic9", "gpu9")):
        graph.edges[edge]["bandwidth"] /= 4
    with pytest.raises(ConfigError, match="(gpu9|nic9)'s links differ"):
        simulate(GPT, PARALLEL, graph)


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
