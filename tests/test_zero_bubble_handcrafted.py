"""ZB-H1 and ZB-H2 (schedules/pipelines/zero_bubble.py) against Qi et al., "Zero Bubble
Pipeline Parallelism" (ICLR 2024, arXiv 2401.10241): the orders of Figure 3 and of the
authors' generator (`get_hand_schedule` in megatron/core/pipeline_parallel/efficiency.py,
branch `arxiv` of sail-sg/zero-bubble-pipeline-parallelism), Table 2's bubbles and peak
activation memories, simulated with free communication.

The paper's B (input gradient) is clustersim's I. With `--uniform-costs 1,2`,
T_F = T_I = T_W = 1 and 1F1B's fused B takes 2. Table 2 (communication free):
  1F1B   bubble (p-1)(T_F+T_B+T_W)    peak p M_B
  ZB-H1  bubble (p-1)(T_F+T_B-T_W)    peak p M_B
  ZB-H2  bubble (p-1)(T_F+T_B-2T_W)   peak (2p-1) M_B
ZB-H2's bubble is per rank (each rank's first start to last end, the authors' cost for
ZB-H2); one iteration, first start to last end, adds the parallelogram's slant: its
last rank starts (p-1)T_F late (the paper overlaps iterations, section 4).
"""
import json

import pytest
import simpy

from clustersim.schedules.names import COMPUTE_LANE
from clustersim.schedules.ops import OpKind
from clustersim.schedules.p2p import add_p2p
from clustersim.schedules.registry import build_schedule, canonical_schedule_name
from clustersim.schedules.validate import validate
from clustersim.sim.cost_model import UniformCostModel
from clustersim.sim.engine import Replay
from clustersim.sim.network import InstantNetwork
from schedule_levels import in_flight
from test_cli import clustersim

K = {"zb-h1": 1, "zb-h2": 2}  # warm-up factor: k(p-1-r) warm-up forwards on rank r
GRID = [(p, m) for p in range(1, 9) for m in range(1, 3 * p + 3)]


def full_pattern(name, p, m):
    """The microbatch counts with the paper's whole pattern: M >= p (ZB-H1), 2p-1 (ZB-H2)."""
    return m >= K[name] * (p - 1) + 1


def replay(schedule, seconds):
    env = simpy.Environment()
    devices = [f"gpu{r}" for r in range(schedule.num_ranks)]
    return Replay(env, add_p2p(schedule), devices, seconds, InstantNetwork(env)).run()


def costs(tf, ti, tw):
    """Op seconds: F, I, W as given, a fused B (1F1B) I + W, communication free."""
    table = {OpKind.F: tf, OpKind.I: ti, OpKind.W: tw, OpKind.B: ti + tw}
    return lambda op: table.get(op.kind, 0.0)


UNIFORM = UniformCostModel(1.0, 2.0).seconds  # --uniform-costs 1,2: F = I = W = 1, B = 2


def rank_spans(timeline):
    """Per rank, its first compute start to its last compute end."""
    ops = [s for s in timeline.spans if s.lane == COMPUTE_LANE]
    return [max(s.end for s in ops if s.rank == r) - min(s.start for s in ops if s.rank == r)
            for r in timeline.ranks]


def authors_order(p, m, k):
    """Rank r's order as the authors' generator writes it (requires the whole pattern):
    k(p-1-r) forwards, then per microbatch i an F while any remain, B(i) (our I) and a W
    once warmup + i >= k(p-1), then the k*r W's left."""
    out = []
    for r in range(p):
        warmup, order, w = k * (p - 1 - r), [], 0
        order += [("F", f) for f in range(warmup)]
        for i in range(m):
            if warmup + i < m:
                order.append(("F", warmup + i))
            order.append(("I", i))
            if warmup + i >= k * (p - 1):
                order.append(("W", w))
                w += 1
        order += [("W", x) for x in range(w, m)]
        out.append(order)
    return out


@pytest.mark.parametrize("name", K)
def test_one_f_i_w_per_stage_and_microbatch_and_the_contract_runs(name):
    for p, m in GRID:
        s = build_schedule(name, p, m)
        assert (s.num_ranks, s.num_stages, tuple(s.stage_ranks)) == (p, p, tuple(range(p)))
        for r, program in enumerate(s.programs):
            assert {op.stage for op in program} == {r}
            keys = [(op.kind, op.microbatch) for op in program]
            assert sorted(keys) == sorted((kind, mb) for kind in (OpKind.F, OpKind.I, OpKind.W)
                                          for mb in range(m))
            for kind in (OpKind.F, OpKind.I, OpKind.W):  # each kind in microbatch order
                assert [mb for k, mb in keys if k is kind] == list(range(m))
            assert all(keys.index((OpKind.I, mb)) < keys.index((OpKind.W, mb))
                       and keys.index((OpKind.F, mb)) < keys.index((OpKind.I, mb))
                       for mb in range(m))
        validate(s)  # DeadlockError otherwise


def torch_text(name, p, m):
    return [",".join(str(op) for op in program) for program in build_schedule(name, p, m).programs]


def test_figure_3_orders_for_4_ranks_and_8_microbatches():
    """Figure 3 (1-based there): ZB-H1's first device runs F1-F4 then B1 W1 F5 B2 W2 ...;
    its last F1 B1 ... F4 B4 W1 F5 B5 W2 ...; ZB-H2's first device F1-F7 before B1."""
    assert torch_text("zb-h1", 4, 8) == [
        "0F0,0F1,0F2,0F3,0I0,0W0,0F4,0I1,0W1,0F5,0I2,0W2,0F6,0I3,0W3,0F7,0I4,0W4,0I5,0W5,0I6,"
        "0W6,0I7,0W7",
        "1F0,1F1,1F2,1I0,1F3,1I1,1W0,1F4,1I2,1W1,1F5,1I3,1W2,1F6,1I4,1W3,1F7,1I5,1W4,1I6,1W5,"
        "1I7,1W6,1W7",
        "2F0,2F1,2I0,2F2,2I1,2F3,2I2,2W0,2F4,2I3,2W1,2F5,2I4,2W2,2F6,2I5,2W3,2F7,2I6,2W4,2I7,"
        "2W5,2W6,2W7",
        "3F0,3I0,3F1,3I1,3F2,3I2,3F3,3I3,3W0,3F4,3I4,3W1,3F5,3I5,3W2,3F6,3I6,3W3,3F7,3I7,3W4,"
        "3W5,3W6,3W7"]
    assert torch_text("zb-h2", 4, 8) == [
        "0F0,0F1,0F2,0F3,0F4,0F5,0F6,0I0,0W0,0F7,0I1,0W1,0I2,0W2,0I3,0W3,0I4,0W4,0I5,0W5,0I6,"
        "0W6,0I7,0W7",
        "1F0,1F1,1F2,1F3,1F4,1I0,1F5,1I1,1F6,1I2,1W0,1F7,1I3,1W1,1I4,1W2,1I5,1W3,1I6,1W4,1I7,"
        "1W5,1W6,1W7",
        "2F0,2F1,2F2,2I0,2F3,2I1,2F4,2I2,2F5,2I3,2F6,2I4,2W0,2F7,2I5,2W1,2I6,2W2,2I7,2W3,2W4,"
        "2W5,2W6,2W7",
        "3F0,3I0,3F1,3I1,3F2,3I2,3F3,3I3,3F4,3I4,3F5,3I5,3F6,3I6,3W0,3F7,3I7,3W1,3W2,3W3,3W4,"
        "3W5,3W6,3W7"]


@pytest.mark.parametrize("name", K)
def test_whole_pattern_is_the_authors_generator(name):
    for p, m in GRID:
        if full_pattern(name, p, m):
            ours = [[(op.kind.value, op.microbatch) for op in program]
                    for program in build_schedule(name, p, m).programs]
            assert ours == authors_order(p, m, K[name]), (p, m)


@pytest.mark.parametrize("name", K)
def test_peak_in_flight_is_table_2_memory(name):
    """Table 2: p M_B for ZB-H1 (1F1B's, i.e. its first rank's), (2p-1) M_B for ZB-H2, on
    EVERY rank (worker i holds (p-i+1) M_B + (i-1) M_W, resp. (2p-2i+1) M_B + (2i-2) M_W:
    microbatches waiting for I or for W). Fewer microbatches: all of them."""
    for p, m in GRID:
        s = build_schedule(name, p, m)
        peak = min(K[name] * (p - 1) + 1, m)
        assert [max(in_flight(program)) for program in s.programs] == [peak] * p, (p, m)
        assert replay(s, UNIFORM).peak_in_flight() == dict.fromkeys(range(p), peak)
        if name == "zb-h1":
            first_rank = max(in_flight(build_schedule("1f1b", p, m).programs[0]))
            assert peak == first_rank


def test_uniform_costs_zb_h1_closed_form_and_a_third_of_1f1b_bubble():
    """F = I = W = 1: ZB-H1 takes 3M + (p-1), 1F1B 3M + 3(p-1): 2(p-1)T_W less, a third of
    the bubble; every rank idles p-1 (1F1B: 3(p-1)). The unit-step dry run agrees."""
    for p, m in GRID:
        if not full_pattern("zb-h1", p, m):
            continue
        zb, ofob = build_schedule("zb-h1", p, m), build_schedule("1f1b", p, m)
        t, base = replay(zb, UNIFORM), replay(ofob, UNIFORM)
        assert t.iteration_time == 3 * m + (p - 1)
        assert base.iteration_time == 3 * (m + p - 1)
        assert base.iteration_time - t.iteration_time == 2 * (p - 1)
        assert 3 * (t.iteration_time - 3 * m) == base.iteration_time - 3 * m
        assert t.idle_time() == dict.fromkeys(range(p), p - 1)
        assert base.idle_time() == dict.fromkeys(range(p), 3 * (p - 1))
        assert validate(zb).makespan == 3 * m + (p - 1)


def test_uniform_costs_zb_h2_zero_bubble_per_rank():
    """F = I = W = 1: every rank of ZB-H2 computes 3M without a gap (zero bubble); ranks
    start T_F apart, so one iteration takes 3M + (p-1)T_F, as ZB-H1 does."""
    for p, m in GRID:
        if not full_pattern("zb-h2", p, m):
            continue
        s = build_schedule("zb-h2", p, m)
        t = replay(s, UNIFORM)
        assert rank_spans(t) == [3 * m] * p
        assert [min(x.start for x in t.spans if x.rank == r) for r in range(p)] == list(range(p))
        assert t.iteration_time == 3 * m + (p - 1)
        assert validate(s).makespan == 3 * m + (p - 1)


# (T_F, T_I, T_W): the paper's T_W < T_F < T_B (Table 1's FLOPs), ZB-H2's zero bubble at
# T_F + T_B = 2T_W with T_B < T_W, a large T_W (ZB-H1's and ZB-H2's bubbles need T_W small)
COSTS = [(2.0, 3.0, 1.0), (3.0, 4.0, 2.0), (1.0, 1.0, 0.5), (2.0, 1.0, 1.5), (1.0, 2.0, 3.0)]


@pytest.mark.parametrize("tf, ti, tw", COSTS)
def test_table_2_bubbles_with_unequal_costs(tf, ti, tw):
    """ZB-H1: M(T_F+T_B+T_W) + (p-1)(T_F+T_B-T_W) when T_W <= min(T_F, T_B), 2(p-1)T_W
    under 1F1B. ZB-H2: each rank's span M(T_F+T_B+T_W) + (p-1)(T_F+T_B-2T_W) when T_W <=
    T_F and 2T_W <= T_F + T_B; the iteration M(T_F+T_B+T_W) + (p-1)max(T_F, T_F+T_B-2T_W)
    (every cost here)."""
    seconds = costs(tf, ti, tw)
    for p in range(1, 7):
        for m in range(p, 3 * p + 2):
            work = m * (tf + ti + tw)
            t1 = replay(build_schedule("zb-h1", p, m), seconds).iteration_time
            base = replay(build_schedule("1f1b", p, m), seconds).iteration_time
            assert base == pytest.approx(work + (p - 1) * (tf + ti + tw))
            if tw <= min(tf, ti):
                assert t1 == pytest.approx(work + (p - 1) * (tf + ti - tw))
                assert base - t1 == pytest.approx(2 * (p - 1) * tw)
            if m >= 2 * p - 1:
                t2 = replay(build_schedule("zb-h2", p, m), seconds)
                assert t2.iteration_time == pytest.approx(
                    work + (p - 1) * max(tf, tf + ti - 2 * tw))
                if tw <= tf and 2 * tw <= tf + ti:
                    assert max(rank_spans(t2)) == pytest.approx(
                        work + (p - 1) * (tf + ti - 2 * tw))


@pytest.mark.parametrize("seconds", [UNIFORM, costs(2.0, 3.0, 1.0), costs(3.0, 4.0, 2.0)],
                         ids=["uniform", "2-3-1", "3-4-2"])
def test_any_microbatch_count_zb_h2_no_slower_than_zb_h1_no_slower_than_1f1b(seconds):
    """Also below the whole pattern (the module's rule for fewer microbatches)."""
    for p, m in GRID:
        h1, h2, base = (replay(build_schedule(name, p, m), seconds).iteration_time
                        for name in ("zb-h1", "zb-h2", "1f1b"))
        assert h2 <= h1 + 1e-9 and h1 <= base + 1e-9, (p, m, h2, h1, base)
        if p > 1:
            assert h1 < base


def test_aliases():
    for alias in ("ZBH1", "zero_bubble_h1", "zb-h1"):
        assert canonical_schedule_name(alias) == "zb-h1"
    for alias in ("zbh2", "Zero-Bubble-H2", "zb_h2"):
        assert canonical_schedule_name(alias) == "zb-h2"


@pytest.mark.parametrize("schedule, peak", [("zb-h1", 4), ("zbh2", 7)])
def test_cli_uniform_costs(tmp_path, schedule, peak):
    """`clustersim simulate --uniform-costs 1,2`, P = 4, M = 8: both take 3*8 + 3 = 27
    (1F1B: 33); ZB-H1 holds 4 microbatches on every rank, ZB-H2 7."""
    metrics = tmp_path / "m.json"
    clustersim("simulate", "--schedule", schedule, "--pp", "4", "--microbatches", "8",
               "--uniform-costs", "1,2", "--model", "llama3-8b", "--num-layers", "8",
               "-o", str(tmp_path / "g.html"), "--metrics-json", str(metrics))
    data = json.loads(metrics.read_text())
    assert data["iteration_time"] == 27
    assert data["per_rank"]["peak_in_flight_microbatches"] == dict.fromkeys("0123", peak)
    assert data["per_rank"]["compute_time"] == dict.fromkeys("0123", 24)
