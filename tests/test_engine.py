"""SimPy replay against closed forms and invariants (uniform costs, zero-cost network)."""
from fractions import Fraction

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.errors import DeadlockError
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.p2p import add_p2p
from clustersim.schedules.names import COMPUTE_LANE
from clustersim.sim.cost_model import UniformCostModel
from clustersim.sim.engine import Replay
from clustersim.sim.flows import FlowNetwork
from clustersim.sim.network import InstantNetwork
from clustersim.topologies import single_node


def replay(schedule, forward=1.0, backward=2.0, network=None):
    env = simpy.Environment()
    lowered = add_p2p(schedule)
    net = network(env) if network else InstantNetwork(env)
    devices = [f"gpu{r}" for r in range(schedule.num_ranks)]
    return Replay(env, lowered, devices, UniformCostModel(forward, backward).seconds, net).run()


def test_issue_numbers_gpipe_1f1b_interleaved():
    for name in ("gpipe", "1f1b"):
        t = replay(build_schedule(name, 4, 8))
        assert t.iteration_time == 33
        assert Fraction(t.bubble_fraction).limit_denominator(1000) == Fraction(9, 33)
    t = replay(build_schedule("interleaved-1f1b", 4, 8, 2))
    assert t.iteration_time == 57
    assert Fraction(t.bubble_fraction).limit_denominator(1000) == Fraction(9, 57)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 8), groups=st.integers(1, 4), v=st.integers(1, 4),
       f=st.sampled_from([0.5, 1.0, 3.0]), b=st.sampled_from([1.0, 2.0, 4.0]))
def test_makespan_closed_forms(p, groups, v, f, b):
    m = groups * p  # the closed forms hold when M is a multiple of P
    if v == 1:
        for name in ("gpipe", "1f1b"):
            t = replay(build_schedule(name, p, m), f, b)
            assert t.iteration_time == pytest.approx((m + p - 1) * (f + b))
            assert t.bubble_fraction == pytest.approx((p - 1) * (f + b) / t.iteration_time)
    elif p > 1:
        t = replay(build_schedule("interleaved-1f1b", p, m, v), f, b)
        assert t.iteration_time == pytest.approx(m * v * (f + b) + (p - 1) * (f + b))


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]),
       p=st.integers(2, 6), m_mult=st.integers(1, 4), v=st.integers(2, 3))
def test_replay_invariants(name, p, m_mult, v):
    v = v if name == "interleaved-1f1b" else 1
    schedule = build_schedule(name, p, p * m_mult, v)
    t = replay(schedule, 1.0, 2.0)
    compute = [s for s in t.spans if s.lane == COMPUTE_LANE]
    keys = [s.op.key for s in compute]
    assert len(keys) == len(set(keys)) == 2 * schedule.num_stages * schedule.num_microbatches
    by_key = {s.op.key: s for s in compute}
    for r in range(p):
        mine = sorted((s for s in compute if s.rank == r), key=lambda s: s.start)
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:])), "overlap on a rank"
    for (kind, stage, mb), span in by_key.items():
        if kind is OpKind.F and stage > 0:
            assert by_key[(OpKind.F, stage - 1, mb)].end <= span.start
        if kind is OpKind.B:
            assert by_key[(OpKind.F, stage, mb)].end <= span.start
            if stage < schedule.num_stages - 1:
                assert by_key[(OpKind.B, stage + 1, mb)].end <= span.start
    if name == "1f1b":
        for r, peak in t.peak_in_flight().items():
            assert peak <= p - r


def test_transfers_cost_latency_plus_bytes_over_bandwidth():
    """GPipe with one microbatch: P*F + P*B + 2(P-1) transfers of 2*latency + n/BW each,
    BW the link's achievable rate (an H100's NVLink: NCCL's 20.6 of 25 GB/s per link)."""
    p, nbytes, line, lat = 4, 10**9, 100e9, 1e-5
    bw = line * 20.6 / 25
    graph = single_node("h100-sxm", num_gpus=p, bandwidth=line, latency=lat)
    schedule = build_schedule("gpipe", p, 1)
    lowered = add_p2p(schedule, lambda s: nbytes)
    env = simpy.Environment()
    t = Replay(env, lowered, [f"gpu{r}" for r in range(p)], UniformCostModel(1.0, 2.0).seconds,
               FlowNetwork(env, graph)).run()
    hop = 2 * lat + nbytes / bw
    assert t.iteration_time == pytest.approx(p * 3.0 + 2 * (p - 1) * hop)
    sends = [s for s in t.spans if s.lane == "send"]
    assert len(sends) == 2 * (p - 1)
    assert all(s.duration == pytest.approx(hop) for s in sends)


def test_broken_schedule_reports_deadlock_with_stuck_ops():
    schedule = build_schedule("1f1b", 2, 2)
    # Rank 1 insists on B(1,1) before F(1,1): it can never get the activation it needs.
    schedule.programs[1] = [Op(OpKind.F, 1, 0), Op(OpKind.B, 1, 1), Op(OpKind.B, 1, 0),
                            Op(OpKind.F, 1, 1)]
    with pytest.raises(DeadlockError) as err:
        replay(schedule)
    assert "rank 1 stuck at 1B1" in str(err.value)
    assert ">1B1<" in err.value.report
