"""A replay leaves no reference cycle per op: the CLI runs with the cyclic garbage
collector off (sim.gc_pause), so anything a cycle holds stays until the run ends. What a
finished replay leaves to the collector must not grow with the number of microbatches
(the SimPy processes, one per rank, are cycles of their own: a constant)."""
import gc

import pytest

import clustersim
from clustersim.sim.simulate import simulate
from clustersim.sim.world import Replaying


def _left_for_the_collector(replaying: Replaying, microbatches: int, **kw) -> int:
    """Objects a gc.collect() finds unreachable after a replay run with it disabled."""
    spec = clustersim.get_model("llama3-8b", micro_batch_size=1, num_layers=4)
    parallel = clustersim.ParallelConfig.from_kwargs(num_microbatches=microbatches, **kw)
    topology = clustersim.load_topology("dgx-h100-x16-ndr")
    gc.collect()
    gc.disable()
    try:
        timeline = simulate(spec, parallel, topology, replaying=replaying)
        assert timeline.iteration_time > 0
        del timeline
        return gc.collect()
    finally:
        gc.enable()


@pytest.mark.parametrize("replaying, kw", [
    (Replaying(), dict(tp=8, pp=2, dp=4, zero_stage=3)),  # gathers across nodes: phases
    (Replaying("all"), dict(tp=8, pp=2, dp=2, sequence_parallel=True)),  # TP meetings
], ids=["symmetric", "every-rank"])
def test_what_a_replay_leaves_to_the_collector_does_not_grow_with_its_ops(replaying, kw):
    few = _left_for_the_collector(replaying, 4, **kw)
    many = _left_for_the_collector(replaying, 16, **kw)
    assert many <= few + 50, (few, many)  # before: 6,650 vs 11,894 and 30,819 vs 72,603
