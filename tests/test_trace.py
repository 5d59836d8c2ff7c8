import json
import math

from clustersim.schedules.registry import build_schedule
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.timeline import MemorySample, Span, Timeline
from clustersim.schedules.validate import dry_run
from clustersim.sim.trace import TRACKS_PER_LANE, chrome_trace, lane_ids, p2p_pairs, write_trace


def pipeline_timeline(pp: int = 4, microbatches: int = 6) -> Timeline:
    """1F1B dry run at 1 ms per step, with a send/recv pair after every F and B."""
    run = dry_run(build_schedule("1f1b", pp, microbatches))
    spans, memory = [], []
    for rank, steps in enumerate(run.steps):
        for op, step in steps:
            start, end = step * 1e-3, step * 1e-3 + 9e-4
            spans.append(Span(rank, "compute", Op(op.kind, op.stage, op.microbatch,
                                                  nbytes=1000, flops=2e12), start, end))
            memory.append(MemorySample(rank, start, int((step + 1) * 1e9)))
            forward = op.kind is OpKind.F
            peer = op.stage + (1 if forward else -1)
            if 0 <= peer < pp:
                send = OpKind.SEND_F if forward else OpKind.SEND_B
                recv = OpKind.RECV_F if forward else OpKind.RECV_B
                spans.append(Span(rank, "send", Op(send, op.stage, op.microbatch, "pp", 4096),
                                  end, end + 5e-5, {"peer": peer}))
                spans.append(Span(peer, "recv", Op(recv, peer, op.microbatch, "pp", 4096),
                                  end - 1e-4, end + 5e-5))
    return Timeline(spans, memory, meta={"plan": {"schedule": "1f1b"}})


def events(trace, ph):
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def test_one_complete_event_per_span_in_microseconds():
    t = pipeline_timeline()
    trace = chrome_trace(t)
    assert trace["displayTimeUnit"] == "ms"
    spans = events(trace, "X")
    assert len(spans) == len(t.spans)
    tids = lane_ids(t)
    for span, e in zip(t.spans, spans):
        assert math.isclose(e["ts"], span.start * 1e6)
        assert math.isclose(e["dur"], (span.end - span.start) * 1e6)
        assert (e["pid"], e["tid"] // TRACKS_PER_LANE, e["name"], e["cat"]) == (
            span.rank, tids[span.lane], str(span.op), span.op.kind.value)
        assert e["args"]["stage"] == span.op.stage
        assert e["args"]["microbatch"] == span.op.microbatch
        assert e["args"]["bytes"] == span.op.nbytes and e["args"]["flops"] == span.op.flops
    send = next(e for e in spans if e["cat"] == "SEND_F")
    assert send["args"]["peer"] == 1 and send["args"]["group"] == "pp"


def test_processes_are_ranks_and_threads_are_named_lanes():
    t = pipeline_timeline()
    meta = events(chrome_trace(t), "M")
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(4)}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert lane_ids(t) == {"compute": 0, "send": 1, "recv": 2}
    assert threads[(0, 0)] == "compute" and threads[(3, 2 * TRACKS_PER_LANE)] == "recv"
    assert (3, TRACKS_PER_LANE) in threads  # the last stage sends gradients back
    assert all(isinstance(tid, int) for _, tid in threads)


def test_memory_samples_become_counters_in_gb():
    t = pipeline_timeline()
    counters = events(chrome_trace(t), "C")
    assert len(counters) == len(t.memory)
    for sample, e in zip(t.memory, counters):
        assert e["name"] == "memory" and e["pid"] == sample.rank
        assert math.isclose(e["ts"], sample.time * 1e6)
        assert math.isclose(e["args"]["GB"], sample.nbytes / 1e9)


def test_flows_pair_each_send_with_its_receive():
    t = pipeline_timeline(pp=4, microbatches=6)
    trace = chrome_trace(t)
    starts, finishes = events(trace, "s"), events(trace, "f")
    expected = 2 * (4 - 1) * 6  # activations down and gradients up, per microbatch
    assert len(starts) == len(finishes) == expected == len(p2p_pairs(t))
    by_id = {e["id"]: e for e in finishes}
    assert len({e["id"] for e in starts}) == expected
    x_at = {(e["pid"], e["tid"], e["ts"], e["dur"]): e for e in events(trace, "X")}
    for s in starts:
        f = by_id[s["id"]]
        assert f["bp"] == "e"
        send = next(e for (pid, tid, ts, dur), e in x_at.items()
                    if pid == s["pid"] and tid == s["tid"] and ts <= s["ts"] <= ts + dur)
        recv = next(e for (pid, tid, ts, dur), e in x_at.items()
                    if pid == f["pid"] and tid == f["tid"] and ts <= f["ts"] <= ts + dur)
        mb = send["args"]["microbatch"]
        assert recv["args"]["microbatch"] == mb
        if send["cat"] == "SEND_F":
            assert recv["cat"] == "RECV_F" and recv["args"]["stage"] == send["args"]["stage"] + 1
        else:
            assert recv["cat"] == "RECV_B" and recv["args"]["stage"] == send["args"]["stage"] - 1


def test_replicated_keys_pair_in_rank_order():
    f = Op(OpKind.SEND_F, 0, 0, "pp")
    r = Op(OpKind.RECV_F, 1, 0, "pp")
    t = Timeline([Span(0, "send", f, 0, 1), Span(2, "send", f, 0, 1),
                  Span(3, "recv", r, 0, 1), Span(1, "recv", r, 0, 1)])
    assert [(s.rank, d.rank) for s, d in p2p_pairs(t)] == [(0, 1), (2, 3)]


def test_trace_is_json_and_written_to_disk(tmp_path):
    t = pipeline_timeline()
    t.meta["plan"]["devices"] = [object()]  # odd metadata must not break serialisation
    path = write_trace(t, tmp_path / "out" / "trace.json")
    loaded = json.loads(path.read_text())
    assert len(loaded["traceEvents"]) == len(chrome_trace(t)["traceEvents"])
    assert loaded["otherData"]["plan"]["schedule"] == "1f1b"


def test_spans_of_one_thread_never_overlap_partially():
    """Chrome and Perfetto nest the complete events of one thread: two transfers of a lane
    in flight at once (rank 5's 5SEND_F38 and 21SEND_B18 in the README's GPT-3 run, issue
    14 item 14) go on two tracks of the lane, and no thread holds overlapping spans."""
    send = Span(5, "send", Op(OpKind.SEND_F, 5, 38, "pp", 1), 0.0, 167e-6)
    other = Span(5, "send", Op(OpKind.SEND_B, 21, 18, "pp", 1), 90e-6, 257e-6)
    later = Span(5, "send", Op(OpKind.SEND_F, 5, 39, "pp", 1), 200e-6, 300e-6)
    timeline = Timeline([send, other, later])
    trace = chrome_trace(timeline)
    base = lane_ids(timeline)["send"] * TRACKS_PER_LANE
    spans = sorted(events(trace, "X"), key=lambda e: e["ts"])
    assert [e["tid"] for e in spans] == [base, base + 1, base]
    names = {e["tid"]: e["args"]["name"] for e in events(trace, "M")
             if e["name"] == "thread_name"}
    assert names == {base: "send", base + 1: "send #2"}
    big = chrome_trace(pipeline_timeline(pp=4, microbatches=8))
    by_thread = {}
    for e in sorted(events(big, "X"), key=lambda e: e["ts"]):
        end = by_thread.get((e["pid"], e["tid"]), -1.0)
        assert e["ts"] >= end - 1e-9
        by_thread[(e["pid"], e["tid"])] = e["ts"] + e["dur"]
