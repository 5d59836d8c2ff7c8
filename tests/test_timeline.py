"""Timeline metrics on a hand-built timeline with known numbers, and its JSON round trip."""
import pytest

from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.timeline import MemorySample, Span, Timeline, peak_in_flight

F, B, I, W = OpKind.F, OpKind.B, OpKind.I, OpKind.W


def compute(rank, kind, stage, mb, start, end):
    return Span(rank, "compute", Op(kind, stage, mb), start, end)


def hand_timeline() -> Timeline:
    """Three ranks over [0, 8] s.

    rank 0: fused backward; compute 6 s (F 0-1, F 1-2, B 4-6, B 6-8); holds 2 microbatches.
    rank 1: split I/W; compute 5 s; holds 2, because 1I0 ends at 3 but 1W0 only at 5.
    rank 2: I with no W (I ends the microbatch); compute 3 s; holds 1.
    Communication spans never count as busy.
    """
    spans = [
        compute(0, F, 0, 0, 0.0, 1.0), compute(0, F, 0, 1, 1.0, 2.0),
        Span(0, "p2p", Op(OpKind.SEND_F, 0, 0, group="pp", nbytes=4096), 1.0, 1.5,
             {"peer": 1}),
        compute(0, B, 0, 0, 4.0, 6.0), compute(0, B, 0, 1, 6.0, 8.0),
        Span(1, "p2p", Op(OpKind.RECV_F, 1, 0, group="pp", nbytes=4096), 0.5, 1.0),
        compute(1, F, 1, 0, 1.0, 2.0), compute(1, I, 1, 0, 2.0, 3.0),
        compute(1, F, 1, 1, 3.0, 4.0), compute(1, W, 1, 0, 4.0, 5.0),
        compute(1, B, 1, 1, 5.0, 6.0),
        Span(1, "dp", Op(OpKind.ALL_REDUCE, 1, None, group="dp", nbytes=1 << 20, flops=0.0),
             6.0, 7.5, {"algorithm": "ring"}),
        compute(2, F, 2, 0, 2.0, 3.0), compute(2, I, 2, 0, 3.0, 4.0),
        compute(2, F, 2, 1, 4.0, 5.0),
    ]
    memory = [MemorySample(0, 0.0, 100), MemorySample(0, 1.0, 300), MemorySample(0, 6.0, 150),
              MemorySample(1, 0.0, 50), MemorySample(1, 3.0, 500), MemorySample(1, 8.0, 0)]
    return Timeline(spans, memory, source="kernels:cpu", meta={"schedule": "hand"})


def test_iteration_time_idle_and_bubbles():
    t = hand_timeline()
    assert t.ranks == [0, 1, 2]
    assert t.iteration_time == 8.0
    assert t.compute_busy() == {0: 6.0, 1: 5.0, 2: 3.0}
    assert t.idle_time() == {0: 2.0, 1: 3.0, 2: 5.0}
    # bubble: nothing in flight. Rank 0's send hides behind its F; rank 1's receive (0.5 s)
    # and all-reduce (1.5 s) are exposed communication, beside its 1 s of bubble
    assert t.bubble_fractions() == {0: 0.25, 1: 0.125, 2: 0.625}
    assert t.exposed_comm_fractions() == {0: 0.0, 1: 0.25, 2: 0.0}
    assert t.bubble_fraction == pytest.approx((0.25 + 0.125 + 0.625) / 3)
    assert t.exposed_comm_fraction == pytest.approx(0.25 / 3)


def test_iteration_time_is_measured_from_the_first_span():
    t = Timeline([compute(0, F, 0, 0, 10.0, 11.0), compute(1, F, 1, 0, 11.0, 14.0)])
    assert t.start_time == 10.0 and t.iteration_time == 4.0
    assert t.idle_time() == {0: 3.0, 1: 1.0}


def test_peak_memory_and_in_flight():
    t = hand_timeline()
    assert t.peak_memory() == {0: 300, 1: 500}
    assert t.peak_in_flight() == {0: 2, 1: 2, 2: 1}


def test_peak_memory_time_is_the_first_time_the_peak_is_reached():
    t = Timeline([], [MemorySample(0, 0.0, 5), MemorySample(0, 2.0, 9), MemorySample(0, 3.0, 4),
                      MemorySample(0, 4.0, 9)])
    assert t.peak_memory_times() == {0: 2.0}


def test_in_flight_weighted_by_stage_bytes():
    """Rank 1 of hand_timeline holds stage 1's microbatches 0 and 1 together (weight 10
    each); rank 2 one microbatch of stage 2 (weight 7)."""
    weights = {0: 1, 1: 10, 2: 7}
    peaks = peak_in_flight(hand_timeline().spans, lambda op: weights[op.stage])
    assert peaks == {0: 2, 1: 20, 2: 7}


def test_in_flight_counts_layer_group_chunks_of_one_op_once():
    def chunk(kind, mb, c, start):
        return Span(0, "compute", Op(kind, 0, mb, chunk=c), start, start + 1)
    spans = [chunk(F, 0, 0, 0), chunk(F, 0, 1, 1), chunk(F, 1, 0, 2), chunk(F, 1, 1, 3),
             chunk(B, 0, 1, 4), chunk(B, 0, 0, 5), chunk(B, 1, 1, 6), chunk(B, 1, 0, 7)]
    assert peak_in_flight(spans) == {0: 2}
    assert peak_in_flight(spans[:2] + spans[4:6]) == {0: 1}


def test_in_flight_releases_before_acquiring_at_the_same_instant():
    spans = [compute(0, F, 0, 0, 0.0, 1.0), compute(0, B, 0, 0, 1.0, 2.0),
             compute(0, F, 0, 1, 2.0, 3.0), compute(0, B, 0, 1, 3.0, 4.0)]
    assert peak_in_flight(spans) == {0: 1}


def test_metrics_json():
    m = hand_timeline().metrics()
    assert m["source"] == "kernels:cpu" and m["iteration_time"] == 8.0
    assert m["meta"] == {"schedule": "hand"}
    per_rank = m["per_rank"]
    assert per_rank["compute_time"] == {"0": 6.0, "1": 5.0, "2": 3.0}
    assert per_rank["idle_time"] == {"0": 2.0, "1": 3.0, "2": 5.0}
    assert per_rank["bubble_fraction"] == {"0": 0.25, "1": 0.125, "2": 0.625}
    assert per_rank["exposed_comm_fraction"] == {"0": 0.0, "1": 0.25, "2": 0.0}
    assert per_rank["peak_in_flight_microbatches"] == {"0": 2, "1": 2, "2": 1}
    assert per_rank["peak_memory_bytes"] == {"0": 300, "1": 500}
    assert per_rank["peak_memory_time"] == {"0": 1.0, "1": 3.0}


def test_empty_timeline():
    t = Timeline([])
    assert t.iteration_time == 0.0 and t.bubble_fraction == 0.0
    assert t.metrics()["per_rank"]["compute_time"] == {}


def test_dict_round_trip():
    t = hand_timeline()
    d = t.to_dict()
    assert d["spans"][2] == {"rank": 0, "lane": "p2p", "op": "0SEND_F0", "start": 1.0,
                             "end": 1.5, "nbytes": 4096, "flops": 0.0, "group": "pp",
                             "info": {"peer": 1}}
    assert d["memory"][1] == [0, 1.0, 300]
    back = Timeline.from_dict(d)
    assert back == t
    assert back.spans[11].op.group == "dp" and back.spans[11].info == {"algorithm": "ring"}


def test_save_load_round_trip(tmp_path):
    t = hand_timeline()
    path = tmp_path / "timeline.json"
    t.save(path)
    back = Timeline.load(path)
    assert back == t
    assert back.metrics() == t.metrics()


def test_time_breakdown_priorities_on_a_hand_timeline():
    """rank 0 over [0, 10]: compute 0-4; TP 3-5 (1 s exposed); DP 4-7 (TP has priority
    4-5, so DP 2 s exposed); PP 8-9; nothing 7-8 and 9-10 = bubble 2 s."""
    spans = [compute(0, F, 0, 0, 0.0, 4.0),
             Span(0, "tp", Op(OpKind.ALL_REDUCE, 0, 0, "tp"), 3.0, 5.0),
             Span(0, "dp", Op(OpKind.ALL_REDUCE, 0, None, "dp_replicate"), 4.0, 7.0),
             Span(0, "send", Op(OpKind.SEND_F, 0, 0, "pp"), 8.0, 9.0),
             compute(0, B, 0, 0, 9.99, 10.0)]
    row = Timeline(spans).time_breakdown()[0]
    assert row["compute"] == pytest.approx(4.01) and row["tp"] == pytest.approx(1.0)
    assert row["dp"] == pytest.approx(2.0) and row["pp"] == pytest.approx(1.0)
    assert row["bubble"] == pytest.approx(1.99)
    assert sum(row.values()) == pytest.approx(10.0)


def test_time_breakdown_sums_to_the_iteration_time_of_every_rank():
    from clustersim.schedules.model_presets import get_model
    from clustersim.schedules.parallel import ParallelConfig
    from clustersim.sim.simulate import simulate
    from clustersim.topologies import fat_tree

    parallel = ParallelConfig(pp=2, tp=4, dp=2, num_microbatches=4, sequence_parallel=True)
    timeline = simulate(get_model("gpt3-1.3b"), parallel, fat_tree("dgx-h100", num_nodes=2))
    breakdown = timeline.time_breakdown()
    for rank, row in breakdown.items():
        assert sum(row.values()) == pytest.approx(timeline.iteration_time, rel=1e-9)
        assert row["compute"] == pytest.approx(timeline.compute_busy()[rank])
        assert row["tp"] > 0 and row["pp"] > 0
    metrics = timeline.metrics()["time_breakdown"]
    assert set(metrics["per_rank"]) == {"0", "1"} and "bubble" in metrics["total"]


def test_time_breakdown_bubble_is_the_closed_form_with_free_communication():
    from clustersim.schedules.model_presets import get_model
    from clustersim.schedules.parallel import ParallelConfig
    from clustersim.sim.cost_model import UniformCostModel
    from clustersim.sim.simulate import simulate
    from clustersim.topologies import fat_tree

    parallel = ParallelConfig(pp=4, tp=2, num_microbatches=8)
    timeline = simulate(get_model("gpt3-1.3b"), parallel, fat_tree("dgx-h100", num_nodes=1),
                        costs=UniformCostModel(1.0, 2.0))
    assert timeline.iteration_time == pytest.approx(33.0)
    for row in timeline.time_breakdown().values():
        assert row["bubble"] == pytest.approx(9.0) and row["compute"] == pytest.approx(24.0)


def test_a_rank_without_memory_samples_is_reported_as_not_measured():
    """A kernels run on CPU records no memory (torch has allocator statistics for CUDA
    only): the summary says so instead of printing 0.0 GB (issue 14, item 16)."""
    from clustersim.sim.report import format_summary

    spans = [Span(r, "compute", Op(OpKind.F, r, 0), r, r + 1.0) for r in range(2)]
    measured = Timeline(spans, [MemorySample(0, 0.0, 3 * 10**9)], source="kernels:cpu")
    rows = format_summary(measured).splitlines()
    table = rows[rows.index(next(r for r in rows if r.split()[:1] == ["rank"])) + 1:][:2]
    assert table[0].endswith("3.0 GB") and table[1].endswith("n/a")
    assert any("not measured" in line for line in rows)
    assert "0.0 GB" not in format_summary(measured)
