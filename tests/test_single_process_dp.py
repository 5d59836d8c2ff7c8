"""torch.nn.DataParallel (`--dp-impl dataparallel`, schedules/single_process_dp.py): the
program of GPU 0 holds, per forward call, a BROADCAST of all parameter bytes before F and a
REDUCE of all gradient bytes after B (torch's replicate and reduce_add_coalesced, in 10 MiB
buckets), then one step; the replay runs them strictly one after another (the reduce
overlaps nothing, the next broadcast follows it), so compute plus exposed communication is
the whole iteration; each collective takes the ring chain's alpha-beta time (nccl-tests:
(n-1) latencies + S / link bandwidth for broadcast and reduce, busbw factor 1), and the
layouts it cannot run are refused."""
import math

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.single_process_dp import REPLICATE_BUCKET
from clustersim.sim.simulate import simulate
from clustersim.topologies import fat_tree, single_node

MODEL = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=8, seq_length=512,
                  vocab_size=8192, micro_batch_size=2)
B, LAT = 100e9, 1e-6  # a node whose every link has bandwidth B and latency LAT


def config(dp=4, m=3, **kw):
    return ParallelConfig.from_kwargs(dp=dp, num_microbatches=m, dp_impl="dataparallel",
                                      micro_batch_size=2, **kw)


def test_every_forward_broadcasts_the_parameters_and_every_backward_reduces_the_gradients():
    plan = resolve(MODEL, config())
    program = lower(plan.build_schedule(), plan).programs[0]
    kinds = [op.kind for op in program if op.kind is not OpKind.OPT_STEP]
    assert kinds == [OpKind.BROADCAST, OpKind.F, OpKind.B, OpKind.REDUCE] * 3
    weights = MODEL.param_count() * MODEL.dtype_bytes  # 16-bit parameters and gradients
    for op in program:
        if op.kind in (OpKind.BROADCAST, OpKind.REDUCE):
            assert op.nbytes == weights and op.group == "dp"
            assert op.count == math.ceil(weights / REPLICATE_BUCKET)
    assert program[-1].kind is OpKind.OPT_STEP


@pytest.mark.parametrize("dp", [2, 4, 8])
def test_the_iteration_is_compute_plus_each_collectives_ring_time(dp):
    # MI300X: outside NCCL's model, so the collectives keep the alpha-beta chain at line
    # rate (NCCL's own on CUDA GPUs: tests/test_nccl_collectives.py)
    topology = single_node("mi300x", num_gpus=dp, bandwidth=B, latency=LAT)
    timeline = simulate(MODEL, config(dp), topology)
    spans = sorted((s for s in timeline.spans if s.rank == 0), key=lambda s: s.start)
    for before, after in zip(spans, spans[1:]):  # nothing overlaps: one after another
        assert after.start >= before.end - 1e-12
    compute = sum(s.duration for s in spans if s.lane == "compute")
    comm = [s for s in spans if s.op.kind in (OpKind.BROADCAST, OpKind.REDUCE)]
    assert timeline.iteration_time == pytest.approx(compute + sum(s.duration for s in comm))
    weights = MODEL.param_count() * MODEL.dtype_bytes
    for span in comm:  # count buckets, each a chain of dp - 1 hops of 2 * LAT (NVSwitch)
        buckets = math.ceil(weights / REPLICATE_BUCKET)
        assert span.duration == pytest.approx(buckets * (dp - 1) * 2 * LAT + weights / B,
                                              rel=1e-6)


def test_it_costs_more_than_ddp_on_the_same_gpus():
    topology = single_node("h100-sxm", num_gpus=8)
    single = simulate(MODEL, config(8, 4), topology)
    ddp = simulate(MODEL, ParallelConfig.from_kwargs(dp=8, num_microbatches=4,
                                                     micro_batch_size=2), topology)
    assert single.iteration_time > ddp.iteration_time
    assert "torch.nn.DataParallel" in single.meta["replayed"]


@pytest.mark.parametrize("kw, field", [
    (dict(pp=2), "pp=2"), (dict(tp=2), "tp=2"), (dict(zero_stage=1), "zero_stage=1"),
    (dict(dp=1), "dp=1 \\(no replica"),
    (dict(bucket_bytes=1 << 20), "bucket_bytes"), (dict(dp_impl="horovod"), "dp_impl")])
def test_layouts_it_cannot_run_are_refused(kw, field):
    with pytest.raises(ConfigError, match=field):
        ParallelConfig.from_kwargs(**{"dp": 4, "num_microbatches": 2,
                                      "dp_impl": "dataparallel", **kw})


def test_gpus_on_two_hosts_are_refused():
    with pytest.raises(ConfigError, match="one process on one host"):
        simulate(MODEL, config(16), fat_tree("dgx-h100", num_nodes=2))


def test_a_split_backward_reduces_after_its_weight_gradients():
    plan = resolve(MODEL, config(4, 4, schedule="zb-h1"))
    program = lower(plan.build_schedule(), plan).programs[0]
    for i, op in enumerate(program):
        if op.kind is OpKind.REDUCE:
            assert program[i - 1].kind is OpKind.W and program[i - 1].microbatch == op.microbatch
    assert sum(op.kind is OpKind.REDUCE for op in program) == 4


@pytest.mark.parametrize("kw, rule", [(dict(schedule="looped-bfs"), "vpp=2"),
                                      (dict(schedule="interleaved-1f1b"), "vpp=2")])
def test_one_stage_only(kw, rule):
    with pytest.raises(ConfigError, match=rule):
        config(4, 4, **kw)


def test_lora_is_refused():
    from dataclasses import replace
    with pytest.raises(ConfigError, match="frozen base weights"):
        simulate(replace(MODEL, lora_rank=8), config(4, 2), single_node("h100-sxm", num_gpus=4))
