"""sim.run_ahead times a rank's compute and intra-node collectives without events; its only
purpose is speed, so these runs must equal the event-by-event replay (Replay.run_ahead =
False) span for span: same ops, lanes, starts and ends, same memory, same iteration.
Cases where runs happen (TP/SP, context parallelism with overlapped TP), and where they
must stop or not start (data-parallel overlap slowdown, ZeRO-3's gathered memory, the full
replay's meetings and a slow GPU)."""
from __future__ import annotations

import pytest

import clustersim
from clustersim.sim.engine import Replay
from clustersim.sim.world import Replaying

MODEL = dict(num_layers=4)
CASES = {
    "tp8-sp-pp2": dict(tp=8, sequence_parallel=True, pp=2, num_microbatches=4),
    "tp4-sp-dp2-overlap": dict(tp=4, sequence_parallel=True, dp=2, pp=1,
                               num_microbatches=4),
    "tp2-cp2-tp-overlap-interleaved": dict(tp=2, sequence_parallel=True, cp=2,
                                           tp_comm_overlap=True, pp=2, vpp=2,
                                           schedule="interleaved-1f1b", num_microbatches=4),
    "zero3-dp4-tp2": dict(tp=2, dp=4, zero_stage=3, pp=1, num_microbatches=2),
    "zb-h1-tp2": dict(tp=2, pp=4, schedule="zb-h1", num_microbatches=8),
}


def _replay(parallel: dict, runs: list, replaying: Replaying = Replaying()):
    model = clustersim.get_model("llama3-8b", **MODEL)
    config = clustersim.ParallelConfig.from_kwargs(micro_batch_size=1, **parallel)
    return clustersim.simulate(model, config, clustersim.load_topology("dgx-h100-x16-ndr"),
                               replaying=replaying)


def _spans(timeline) -> list:
    return sorted((s.rank, s.lane, str(s.op), s.start, s.end) for s in timeline.spans)


def _both(monkeypatch, parallel: dict, replaying: Replaying = Replaying()):
    """(event-by-event timeline, run-ahead timeline, ops timed ahead)."""
    timed: list[int] = []
    original = Replay._run_ahead

    def counting(self, rank, run, resume):
        timed.append(len(run))
        return original(self, rank, run, resume)

    monkeypatch.setattr(Replay, "_run_ahead", counting)
    monkeypatch.setattr(Replay, "run_ahead", False)
    events = _replay(parallel, timed, replaying)
    assert not timed
    monkeypatch.setattr(Replay, "run_ahead", True)
    ahead = _replay(parallel, timed, replaying)
    return events, ahead, sum(timed)


def _assert_same(events, ahead) -> None:
    a, b = _spans(events), _spans(ahead)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[:3] == y[:3]
        assert x[3] == pytest.approx(y[3], rel=1e-12, abs=1e-15)
        assert x[4] == pytest.approx(y[4], rel=1e-12, abs=1e-15)
    assert ahead.iteration_time == pytest.approx(events.iteration_time, rel=1e-12)
    assert ahead.peak_memory() == events.peak_memory()


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_ahead_equals_the_event_replay(case, monkeypatch):
    events, ahead, timed = _both(monkeypatch, CASES[case])
    _assert_same(events, ahead)
    if case != "zero3-dp4-tp2":  # ZeRO-3 gathers hold memory per op: never run ahead
        assert timed > 0, "the run-ahead never ran: this case tests nothing"


def test_full_replay_with_a_slow_gpu_equals_the_event_replay(monkeypatch):
    parallel = dict(tp=2, sequence_parallel=True, pp=2, dp=2, num_microbatches=4)
    events, ahead, _ = _both(monkeypatch, parallel, Replaying("all", ((1, 1.5),)))
    _assert_same(events, ahead)
