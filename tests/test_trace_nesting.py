"""Every slice of the Perfetto trace nests on its thread (issue 18): `nesting_violations`
checks Perfetto's rule (on one (pid, tid), any two slices are disjoint or one holds the
other, times read as Perfetto reads them, llround(µs * 1000) ns), over simulated runs of
several schedules and layouts, and over arbitrary timelines."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.timeline import Span, Timeline
from clustersim.sim.simulate import simulate
from clustersim.sim.trace import chrome_trace, nesting_violations, perfetto_ns
from clustersim.topologies import load_topology

DENSE = get_model("llama3-8b", num_layers=8, seq_length=2048)
MOE = get_model("mixtral-8x7b", num_layers=4, seq_length=2048)
CONFIGS = {
    "1f1b dp tp": (DENSE, dict(pp=2, dp=2, tp=2, num_microbatches=4)),
    "interleaved": (DENSE, dict(schedule="interleaved-1f1b", pp=2, vpp=2, dp=2,
                                num_microbatches=4)),
    "zb-h1": (DENSE, dict(schedule="zb-h1", pp=4, num_microbatches=8)),
    "dualpipe": (DENSE, dict(schedule="dualpipe", pp=2, dp=2, num_microbatches=4)),
    "dualpipev moe ep": (MOE, dict(schedule="dualpipev", pp=2, dp=2, ep=2,
                                   num_microbatches=4)),
    "zero-3": (DENSE, dict(pp=2, dp=4, zero_stage=3, num_microbatches=4)),
    "tp comm overlap": (DENSE, dict(pp=2, tp=4, sequence_parallel=True,
                                    tp_comm_overlap=True, num_microbatches=4)),
    "context parallel": (DENSE, dict(pp=2, tp=2, cp=2, num_microbatches=4)),
}


def x_events(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def send(start, end, mb=0):
    return Span(0, "send", Op(OpKind.SEND_F, 0, mb, "pp", 1), start, end)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_slice_of_a_simulated_run_nests_on_its_thread(name):
    model, layout = CONFIGS[name]
    timeline = simulate(model, ParallelConfig.from_kwargs(**layout),
                        load_topology("dgx-h100"))
    trace = chrome_trace(timeline)
    assert len(x_events(trace)) == len(timeline.spans) > 0
    assert nesting_violations(trace) == []


def test_abutting_spans_stay_apart_after_perfetto_rounds_them():
    """A span ending where the next starts: written as start * 1e6 and duration * 1e6,
    Perfetto rounds the two separately and ends the first 1 ns after the second starts
    (1003 + 2000 > 3002 ns here); start and end on the ns grid keep them apart."""
    start = 1.0025e-6
    end = start + 2e-6
    assert perfetto_ns(start * 1e6) + perfetto_ns((end - start) * 1e6) > perfetto_ns(end * 1e6)
    trace = chrome_trace(Timeline([send(start, end, 0), send(end, end + 1e-6, 1)]))
    first, second = sorted(x_events(trace), key=lambda e: e["ts"])
    assert first["tid"] == second["tid"]  # one track: they do not overlap in seconds
    assert perfetto_ns(first["ts"]) + perfetto_ns(first["dur"]) == perfetto_ns(second["ts"])
    assert nesting_violations(trace) == []


def test_the_validator_flags_partial_overlap_only():
    def event(ts, dur, tid=0, name="x"):
        return {"ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": dur, "name": name}

    nested = [event(0, 10, name="outer"), event(2, 3, name="inner"), event(5, 0),
              event(10, 0), event(10, 4)]  # a child, an instant, two slices after it
    assert nesting_violations({"traceEvents": nested}) == []
    other_thread = [event(0, 10), event(5, 10, tid=1)]
    assert nesting_violations({"traceEvents": other_thread}) == []
    crossing = [event(0, 10, name="a"), event(2, 3, name="b"), event(4, 7, name="c")]
    problems = nesting_violations({"traceEvents": crossing})
    assert len(problems) == 1 and "c [4000, 11000] ns" in problems[0]
    assert "inside b (ends 5000 ns)" in problems[0]  # the innermost slice it crosses
    # 1 ns of overlap as Perfetto rounds: 0.0015 us -> 2 ns
    assert len(nesting_violations({"traceEvents": [event(0, 0.0025), event(0.0015, 1)]})) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e3), st.floats(0, 1e-2), st.sampled_from(
    ["compute", "send", "tp"])), min_size=1, max_size=40))
def test_any_timeline_nests(spans):
    """Arbitrary starts (s) and durations (s) on a few lanes of one rank, overlapping at will."""
    timeline = Timeline([Span(0, lane, Op(OpKind.ALL_REDUCE, 0, i, "tp", 8), start,
                              start + duration)
                         for i, (start, duration, lane) in enumerate(spans)])
    trace = chrome_trace(timeline)
    assert len(x_events(trace)) == len(spans)
    assert nesting_violations(trace) == []
