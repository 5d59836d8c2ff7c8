"""The distributed optimizer's overlaps (issue 14, item 10), as Megatron-LM runs them:
--overlap-grad-reduce posts each gradient bucket's reduce-scatter as the last
microbatch's backward produces it (was: never, for ZeRO-1, and --no-overlap-grad-reduce
changed nothing); --overlap-param-gather runs the parameter all-gathers of the step
during the next forward, each layer group's before that group computes. Checked on the
replayed timeline: the order of spans (what starts before what ends) and that hiding
communication takes its time off the iteration."""
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

GPT = get_model("gpt3-1.3b")
GRAPH = load_topology("dgx-h100")


def run(**kw):
    timeline = simulate(GPT, ParallelConfig(dp=8, zero_stage=1, num_microbatches=2, **kw),
                        GRAPH)
    mine = [s for s in timeline.spans if s.rank == 0]
    return timeline, mine


def of(spans, kind):
    return [s for s in spans if s.op.kind is kind]


@pytest.mark.parametrize("overlap", [True, False])
def test_reduce_scatters_overlap_the_backward_only_when_asked(overlap):
    timeline, spans = run(overlap_grad_reduce=overlap)
    backward_end = max(s.end for s in of(spans, OpKind.B))
    scatters = of(spans, OpKind.REDUCE_SCATTER)
    if overlap:
        assert min(s.start for s in scatters) < backward_end
    else:
        assert min(s.start for s in scatters) >= backward_end


def test_overlapping_the_reduce_scatter_takes_its_time_off_the_iteration():
    """Without overlap every reduce-scatter is exposed after the backward; with it only
    what is left when the backward ends (the last buckets)."""
    serial, spans = run(overlap_grad_reduce=False)
    overlapped, _ = run()
    backward_end = max(s.end for s in of(spans, OpKind.B))
    scatter_time = max(s.end for s in of(spans, OpKind.REDUCE_SCATTER)) - backward_end
    assert scatter_time > 0
    assert overlapped.iteration_time < serial.iteration_time - 0.5 * scatter_time


def test_param_gathers_run_during_the_next_forward():
    plain, plain_spans = run()
    hidden, spans = run(overlap_param_gather=True)
    step_end = max(s.end for s in of(spans, OpKind.OPT_STEP))
    gathers = of(spans, OpKind.ALL_GATHER)
    assert gathers and all(s.end <= step_end for s in gathers)  # none after the step
    assert sum(s.op.nbytes for s in gathers) == sum(s.op.nbytes
                                                   for s in of(plain_spans, OpKind.ALL_GATHER))
    forwards = [s for s in of(spans, OpKind.F) if s.op.microbatch == 0]
    assert len(forwards) > 1  # the first forward runs layer group by layer group
    for forward in forwards:
        own = [s for s in gathers if s.op.chunk == forward.op.chunk]
        assert own and forward.start >= max(s.end for s in own) - 1e-12
    gather_time = sum(s.duration for s in of(plain_spans, OpKind.ALL_GATHER))
    first_group = max(s.end for s in gathers if s.op.chunk == 0)

    def slowed(spans):  # what running beside the collectives cost the compute (sim.engine)
        return sum((s.info or {}).get("overlap_slowdown_s", 0.0) for s in spans
                   if s.lane == "compute")
    cost = slowed(spans) - slowed(plain_spans)
    assert plain.iteration_time - hidden.iteration_time >= (
        0.9 * (gather_time - first_group) - cost)


@pytest.mark.parametrize("kw", [
    dict(dp=8, zero_stage=0), dict(dp=8, zero_stage=3), dict(dp=1, zero_stage=1),
    dict(dp=8, zero_stage=1, overlap_grad_reduce=False)])
def test_overlap_param_gather_is_refused_where_there_is_no_such_gather(kw):
    with pytest.raises(ConfigError, match="overlap_param_gather"):
        ParallelConfig(overlap_param_gather=True, **kw)


def test_the_kernels_refuse_it_rather_than_run_the_gathers_elsewhere():
    pytest.importorskip("torch")
    from clustersim.kernels import KernelsError, run_schedule
    from clustersim.schedules.plan import resolve
    model = get_model("gpt3-1.3b", num_layers=2, hidden_size=64, num_attention_heads=4,
                      seq_length=16, vocab_size=128)
    plan = resolve(model, ParallelConfig(dp=2, zero_stage=1, overlap_param_gather=True,
                                         num_microbatches=1))
    with pytest.raises(KernelsError, match="overlap_param_gather"):
        run_schedule(plan.build_schedule(), plan)
