"""Interleaved zero bubble and ZB-V (schedules/pipelines/interleaved_zero_bubble.py,
zero_bubble_v.py) against torch.distributed.pipelining's ScheduleInterleavedZeroBubble and
ScheduleZBVZeroBubble (when torch is installed): the same per-rank F/I/W order, and the
same inputs refused; then the contract (every op once, no deadlock, a replay to the end)
and the closed forms of the papers (Qi et al., ICLR 2024, arXiv 2401.10241; Qi et al.,
"Pipeline Parallelism with Controllable Memory", arXiv 2405.15362) for memory and, with
F = I = W, the iteration."""
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.ops import OpKind
from clustersim.schedules.p2p import add_p2p
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.validate import validate
from clustersim.sim.cost_model import UniformCostModel
from clustersim.sim.engine import Replay
from clustersim.sim.network import InstantNetwork
from schedule_levels import in_flight

IZB, ZBV = "interleaved-zero-bubble", "zbv-zero-bubble"
SETTINGS = settings(max_examples=40, deadline=None)


def izb_accepts(pp, mb):
    """torch's rule: max(1, M // P) rounds of equal size."""
    return mb % max(1, mb // pp) == 0


def izb_configs():
    return [(pp, mb, vpp) for pp in range(1, 7) for mb in range(1, 17) for vpp in range(1, 5)
            if izb_accepts(pp, mb)]


def zbv_configs():
    return [(pp, mb, 2) for pp in range(1, 7) for mb in range(1, 17)]


class _Stage:
    """What torch's schedule constructors read of a pipeline stage (rank 0's; every
    rank's order is computed by every rank)."""

    def __init__(self, pp, num_stages, index):
        self.group_size, self.group_rank, self.num_stages = pp, 0, num_stages
        self.stage_index, self.submod = index, None


def torch_order(cls, pp, mb, vpp):
    """torch's `pipeline_order` (idle steps dropped, as text), or None when torch's
    constructor refuses the degrees (ValueError; anything else fails the test)."""
    stages = [_Stage(pp, pp * vpp, k * pp) for k in range(vpp)]
    try:
        schedule = cls(stages, mb)
    except ValueError:
        return None
    return [[str(a) for a in schedule.pipeline_order[r] if a is not None] for r in range(pp)]


def ours(name, pp, mb, vpp):
    """Our programs as text, or None when build_schedule refuses (one-line ConfigError)."""
    try:
        schedule = build_schedule(name, pp, mb, vpp)
    except ConfigError as e:
        assert "\n" not in str(e)
        return None
    return [[str(op) for op in program] for program in schedule.programs]


@pytest.mark.parametrize("pp", range(1, 7))
def test_order_and_refusals_are_torchs(pp):
    """Every pp 1..6, microbatches 1..16, stages per rank 1..4 (ZB-V: 1..3): torch's
    constructor and ours accept the same degrees and give every rank the same order."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    accepted = 0
    for name, cls, vpps in ((IZB, schedules.ScheduleInterleavedZeroBubble, range(1, 5)),
                            (ZBV, schedules.ScheduleZBVZeroBubble, range(1, 4))):
        for mb in range(1, 17):
            for vpp in vpps:
                theirs = torch_order(cls, pp, mb, vpp)
                assert ours(name, pp, mb, vpp) == theirs, (name, pp, mb, vpp)
                accepted += theirs is not None
    assert accepted == sum(izb_accepts(pp, mb) for mb in range(1, 17)) * 4 + 16


@SETTINGS
@given(st.integers(1, 8), st.integers(1, 40), st.integers(1, 6))
def test_the_rank_generators_are_torchs_on_a_wider_grid(pp, mb, vpp):
    """Each rank's generator (`_calculate_single_rank_operations`, as tests/
    test_looped_bfs.py reads it: a stand-in object with the attributes it reads)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    rounds = max(1, mb // pp)
    if izb_accepts(pp, mb):
        fake = type("IZB", (), {"pp_group_size": pp, "n_local_stages": vpp,
                                "_n_microbatches": mb, "number_of_rounds": rounds,
                                "microbatches_per_round": mb // rounds})()
        calc = schedules.ScheduleInterleavedZeroBubble._calculate_single_rank_operations
        assert ours(IZB, pp, mb, vpp) == [[str(a) for a in calc(fake, r) if a is not None]
                                          for r in range(pp)]
    fake = type("ZBV", (), {"pp_group_size": pp, "num_stages": 2 * pp, "_n_microbatches": mb})()
    calc = schedules.ScheduleZBVZeroBubble._calculate_single_rank_operations
    assert ours(ZBV, pp, mb, 2) == [[str(a) for a in calc(fake, r) if a is not None]
                                    for r in range(pp)]


@pytest.mark.parametrize("name, pp, mb, vpp, field, rule", [
    (IZB, 4, 9, 2, "microbatches", "must be a multiple of 2, got 9 with pp=4 .e.g. 8 or 10"),
    (IZB, 3, 7, 1, "microbatches", "must be a multiple of 2, got 7 with pp=3 .e.g. 6 or 8"),
    (IZB, 4, 13, 3, "microbatches", "must be a multiple of 3, got 13 with pp=4 .e.g. 12 or 15"),
    (IZB, 2, 4, 0, "vpp", ">= 1"),
    (IZB, 0, 4, 2, "pp", ">= 1"),
    (ZBV, 4, 8, 1, "vpp", ">= 2 and <= 2"),
    (ZBV, 4, 8, 3, "vpp", ">= 2 and <= 2"),
    (ZBV, 2, 0, 2, "microbatches", ">= 1"),
])
def test_refused_degrees_name_the_field_and_the_rule(name, pp, mb, vpp, field, rule):
    with pytest.raises(ConfigError, match=rf"{field}.*{rule}") as refused:
        build_schedule(name, pp, mb, vpp)
    assert "\n" not in str(refused.value)


def test_a_run_with_refused_microbatches_is_refused_before_it_is_built():
    with pytest.raises(ConfigError, match="microbatches must be a multiple of 2"):
        ParallelConfig(pp=4, num_microbatches=9, schedule="InterleavedZeroBubble", vpp=2)
    assert ParallelConfig(pp=4, num_microbatches=10, schedule="zbv", vpp=2).schedule == ZBV


def replay(schedule):
    """Event replay with F = 1 and B = 2 (I = W = 1), communication free."""
    env = simpy.Environment()
    return Replay(env, add_p2p(schedule), [f"gpu{r}" for r in range(schedule.num_ranks)],
                  UniformCostModel(1.0, 2.0).seconds, InstantNetwork(env)).run()


@pytest.mark.parametrize("name, pp, mb, vpp", [(IZB, *c) for c in izb_configs()]
                         + [(ZBV, *c) for c in zbv_configs()])
def test_every_op_once_no_deadlock_and_the_iteration_closed_forms(name, pp, mb, vpp):
    """One F, one I and one W of every (stage, microbatch), each on its stage's rank; the
    contract's unit-time dry run and the event replay with uniform costs both end.

    With F = I = W = 1 the last rank's first op, stage P-1's forward of microbatch 0,
    cannot start before step P-1, and each rank has 3 ops per microbatch-chunk, so no
    iteration is shorter than 3VM + P - 1; ZB-H1 (ZB paper, section 2.1: bubble
    (P-1)(F+B-W), B the input backward) and its interleaved form reach it once M >= P,
    ZB-V (section 6, 'zero bubble' with T_F = T_B = T_W) once M >= 2P-1, torch's fill."""
    s = build_schedule(name, pp, mb, vpp)
    keys = sorted(op.key for op in s.ops())
    assert keys == sorted((kind, stage, m) for kind in (OpKind.F, OpKind.I, OpKind.W)
                          for stage in range(pp * vpp) for m in range(mb))
    unit = validate(s).makespan  # structure, contract, DeadlockError otherwise
    timeline = replay(s)
    assert timeline.iteration_time == unit  # the replay's costs are the dry run's units
    assert unit >= 3 * vpp * mb + pp - 1
    if mb >= (pp if name == IZB else 2 * pp - 1):
        assert unit == 3 * vpp * mb + pp - 1


@pytest.mark.parametrize("pp, mb", [(pp, mb) for pp, mb, _ in zbv_configs()])
def test_zbv_holds_1f1bs_first_rank_peak_on_every_rank(pp, mb):
    """ZB-V's activation memory (ZB paper, section 6; the controllable-memory paper's
    V-ZB): 1F1B's, P microbatches of a stage, on every rank. A ZB-V chunk is half a 1F1B
    stage, so in microbatch-chunks held from F to W (schedule_levels.in_flight) every rank
    peaks at no more than twice 1F1B's rank 0, 2 min(P, M), and at exactly 2P once torch
    fills the pipeline (M >= 2P-1)."""
    first_rank = max(in_flight(build_schedule("1f1b", pp, mb).programs[0]))
    assert first_rank == min(pp, mb)
    peaks = [max(in_flight(program)) for program in build_schedule(ZBV, pp, mb).programs]
    assert max(peaks) <= 2 * first_rank
    if mb >= 2 * pp - 1:
        assert peaks == [2 * pp] * pp


@pytest.mark.parametrize("pp, mb, vpp", izb_configs())
def test_interleaved_zero_bubble_peak_memory(pp, mb, vpp):
    """Rank r warms up with (V-1)G + P-1-r forwards (G = M / max(1, M // P), capped at VM)
    and defers its weight gradients by r steps of one F and one I each, so every rank
    peaks at min((V-1)G + P, VM) microbatch-chunks; with V = 1 that is ZB-H1's claim (ZB
    paper, section 2.1): 1F1B's first-rank peak, min(P, M), on every rank."""
    group = mb // max(1, mb // pp)
    peaks = {max(in_flight(program)) for program in build_schedule(IZB, pp, mb, vpp).programs}
    assert peaks == {min((vpp - 1) * group + pp, vpp * mb)}
    if vpp == 1:
        assert peaks == {max(in_flight(build_schedule("1f1b", pp, mb).programs[0]))}
