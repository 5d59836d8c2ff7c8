"""GPipe, 1F1B and interleaved 1F1B (schedules/pipelines/gpipe.py, one_f_one_b.py,
interleaved.py) against torch.distributed.pipelining 2.13's ScheduleGPipe, Schedule1F1B and
ScheduleInterleaved1F1B, built over stand-in stages without a process group (the technique
of tests/test_zero_bubble_torch_order.py): on pp 1..6, microbatches 1..16 (vpp 2..4 when
interleaved), torch's constructor and build_schedule accept the same degrees and every
rank computes the same F/B order (torch's None idle steps and REDUCE_GRAD dropped).

torch's order, per class:
- ScheduleInterleaved1F1B: `pipeline_order`, built in __init__ for every rank, and the
  compute actions of `pipeline_order_with_comms` lowered from it (what its runtime runs).
- ScheduleGPipe, Schedule1F1B: each rank runs `_step_microbatches`, torch's own loop, on a
  stage that records each forward_one_chunk / backward_one_chunk and posts no p2p ops.
  Their `pipeline_order` (built in __init__ by `_get_pipeline_order`, for the schedule
  visualizer, pytorch/pytorch#155935) is checked too; it does not drive their runs.

Known differences, xfail(strict=True):
- Schedule1F1B refuses microbatches < pp; we (and Megatron-LM's
  forward_backward_pipelining_without_interleaving: min(P-r-1, M) warm-up forwards) run it.
- Schedule1F1B's `pipeline_order` gives the last rank forwards 1..M, not 0..M-1.
ScheduleInterleaved1F1B also runs M % max(1, M // pp) == 0 (pytorch/pytorch#129597), in
rounds; so does interleaved-1f1b, Megatron's schedule whenever M is a multiple of pp."""
import functools

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.ops import action_texts
from clustersim.schedules.registry import build_schedule

S = pytest.importorskip("torch.distributed.pipelining.schedules")

PPS, MBS, VPPS = range(1, 7), range(1, 17), range(2, 5)
SINGLE = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}
COMPUTE = ("F", "B")

ONE_F_ONE_B_REFUSES = ("torch's Schedule1F1B.__init__ raises ValueError for microbatches < pp "
                       "(number of stages); ours runs min(pp-r-1, M) warm-up forwards")
LAST_RANK_IR = ("torch's Schedule1F1B._get_pipeline_order: on the last rank (num_forward 0) "
                "forward_mb is incremented before its first use, so its forwards are "
                "microbatches 1..M, not 0..M-1 as ours and torch's _step_microbatches")


def ours(name, pp, mb, vpp=None):
    """Our programs as torch action text, or None when build_schedule refuses."""
    try:
        schedule = build_schedule(name, pp, mb, vpp)
    except ConfigError:
        return None
    return [action_texts(program) for program in schedule.programs]


def compute(actions):
    return [str(a) for a in actions if a is not None and a.computation_type.value in COMPUTE]


class _Recorder:
    """What ScheduleGPipe / Schedule1F1B read of their stage: rank `rank` of `pp`, one stage
    each. Its compute ops record torch's _Action text; it has no p2p ops to post."""

    def __init__(self, pp, rank):
        self.num_stages, self.stage_index = pp, rank
        self.is_first, self.is_last = rank == 0, rank == pp - 1
        self.done = []

    def _no_ops(self, mb):
        return []

    get_fwd_recv_ops = get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = _no_ops

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.done.append(str(S._Action(self.stage_index, S.FORWARD, mb)))

    def backward_one_chunk(self, mb, **kwargs):
        self.done.append(str(S._Action(self.stage_index, S.FULL_BACKWARD, mb)))

    def perform_reduce_grad(self, scale):
        pass


@functools.cache
def torch_single(name, pp, mb):
    """(each rank's order as `_step_microbatches` runs it, `pipeline_order`'s compute
    actions), or None when the constructor refuses (ValueError)."""
    cls, runs = getattr(S, SINGLE[name]), []
    for rank in range(pp):
        stage = _Recorder(pp, rank)
        try:
            schedule = cls(stage, mb)
        except ValueError:
            return None
        schedule._stage_forward_initialized = True  # no shape inference, no p2p warm-up
        schedule._step_microbatches()
        runs.append(stage.done)
    return runs, [compute(schedule.pipeline_order[r]) for r in range(pp)]


class _Stage:
    """What ScheduleInterleaved1F1B reads of rank 0's stages (every rank's order is
    computed by every rank)."""

    def __init__(self, pp, num_stages, index):
        self.group_size, self.group_rank, self.num_stages = pp, 0, num_stages
        self.stage_index, self.submod = index, None


def torch_interleaved(pp, mb, vpp):
    """Each rank's `pipeline_order` as compute text, or None when torch refuses."""
    stages = [_Stage(pp, pp * vpp, k * pp) for k in range(vpp)]
    try:
        schedule = S.ScheduleInterleaved1F1B(stages, mb)
    except ValueError:
        return None
    order = [compute(schedule.pipeline_order[r]) for r in range(pp)]
    assert order == [compute(schedule.pipeline_order_with_comms[r]) for r in range(pp)]
    return order


def case(*values, reason=None):
    """One parametrized case, xfail(strict) with `reason` when given."""
    if reason is None:
        return pytest.param(*values)
    return pytest.param(*values, marks=pytest.mark.xfail(
        strict=True, raises=AssertionError, reason=reason))


@pytest.mark.parametrize("name, pp, mb", [
    case(name, pp, mb, reason=ONE_F_ONE_B_REFUSES if name == "1f1b" and mb < pp else None)
    for name in SINGLE for pp in PPS for mb in MBS])
def test_single_stage_runs_are_torchs(name, pp, mb):
    theirs = torch_single(name, pp, mb)
    assert ours(name, pp, mb) == (theirs and theirs[0]), (name, pp, mb)


def accepted(name, pp):
    """The microbatch counts torch's constructor takes for `name` at `pp`."""
    return [mb for mb in MBS if name == "gpipe" or mb >= pp]


@pytest.mark.parametrize("name, pp", [(name, pp) for name in SINGLE for pp in PPS])
def test_single_stage_pipeline_order_but_the_last_rank_is_ours(name, pp):
    for mb in accepted(name, pp):
        assert ours(name, pp, mb)[:-1] == torch_single(name, pp, mb)[1][:-1], mb


@pytest.mark.parametrize("name, pp", [
    case(name, pp, reason=LAST_RANK_IR if name == "1f1b" else None)
    for name in SINGLE for pp in PPS])
def test_single_stage_pipeline_order_of_the_last_rank_is_ours(name, pp):
    for mb in accepted(name, pp):
        assert ours(name, pp, mb)[-1] == torch_single(name, pp, mb)[1][-1], mb


def torch_runs_interleaved(pp, mb):
    return mb % max(1, mb // pp) == 0


@pytest.mark.parametrize("pp, mb", [
    case(pp, mb) for pp in PPS for mb in MBS])
def test_interleaved_order_and_refusals_are_torchs(pp, mb):
    for vpp in VPPS:
        assert ours("interleaved-1f1b", pp, mb, vpp) == torch_interleaved(pp, mb, vpp), vpp


def test_the_differences_are_the_known_ones():
    """The xfail set above, listed (the cases check it against torch's constructors):
    Schedule1F1B refuses the 15 (pp, M) with M < pp; everywhere else both run or both
    refuse, interleaved 1F1B's 37 (pp, M) that are no multiple of pp included."""
    assert sum(mb < pp for pp in PPS for mb in MBS) == 15
    assert sum(torch_runs_interleaved(pp, mb) and mb % pp > 0 for pp in PPS for mb in MBS) == 37
