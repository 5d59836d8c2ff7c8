"""Structure checks and the unit-time dry run: deadlocks are reported, never hung on."""
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.errors import ConfigError, DeadlockError
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.p2p import add_p2p
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.validate import check_structure, dry_run, validate

F, B, I, W = OpKind.F, OpKind.B, OpKind.I, OpKind.W


def schedule(*programs, mb=2, stages=None):
    return Schedule("hand", mb, [[Op(k, s, m) for k, s, m in p] for p in programs],
                    stages or len(programs))


def test_cross_rank_cycle_is_a_deadlock_with_a_marked_report():
    """Rank 0 waits for the gradient of microbatch 0 before it sends forward microbatch 1;
    rank 1 runs forward microbatch 1 before backward microbatch 0: neither can move."""
    s = schedule([(F, 0, 0), (B, 0, 0), (F, 0, 1), (B, 0, 1)],
                 [(F, 1, 1), (F, 1, 0), (B, 1, 0), (B, 1, 1)])
    check_structure(s)  # structurally fine: only the order is wrong
    start = time.perf_counter()
    with pytest.raises(DeadlockError) as info:
        validate(s)
    assert time.perf_counter() - start < 5  # a hang, not a speed target (CI is loaded)
    err = info.value
    assert err.stuck == {0: Op(B, 0, 0), 1: Op(F, 1, 1)}
    message = err.args[0]
    assert "rank 0 stuck at 0B0 waiting for 0RECV_B0" in message
    assert "rank 1 stuck at 1F1 waiting for 1RECV_F1" in message
    assert ">0B0<" in err.report and ">1F1<" in err.report
    lines = err.report.splitlines()
    assert lines[1].startswith("rank 0") and lines[1].rstrip().endswith(">0B0<")
    assert lines[2].startswith("rank 1") and lines[2].rstrip().endswith(">1F1<")
    assert err.report in str(err)


def test_backward_swapped_before_its_forward_is_a_deadlock():
    s = build_schedule("1f1b", 2, 2)
    p1 = s.programs[1]
    p1[0], p1[1] = p1[1], p1[0]  # rank 1: B(1,0) before F(1,0)
    assert [str(op) for op in p1[:2]] == ["1B0", "1F0"]
    with pytest.raises(DeadlockError) as info:
        dry_run(s)
    err = info.value
    assert err.stuck == {0: Op(B, 0, 0), 1: Op(B, 1, 0)}
    assert "rank 1 stuck at 1B0 waiting for 1F0" in err.args[0]
    assert "rank 0 stuck at 0B0 waiting for 0RECV_B0" in err.args[0]
    assert ">1B0<" in err.report and ">0B0<" in err.report
    # what ran before the stall is in the grid: rank 0 got both forwards done
    assert "0F0" in err.report and "0F1" in err.report


def test_single_rank_self_wait_reports_only_that_rank():
    s = schedule([(B, 0, 0), (F, 0, 0)], mb=1)
    with pytest.raises(DeadlockError) as info:
        validate(s)
    assert info.value.stuck == {0: Op(B, 0, 0)}
    assert "1 rank(s)" in info.value.args[0]


def test_dry_run_grid_of_a_valid_schedule():
    run = validate(build_schedule("gpipe", 2, 2))
    assert run.makespan == 6
    assert [[(str(op), t) for op, t in r] for r in run.steps] == [
        [("0F0", 0), ("0F1", 1), ("0B0", 4), ("0B1", 5)],
        [("1F0", 1), ("1F1", 2), ("1B0", 3), ("1B1", 4)],
    ]
    grid = run.grid().splitlines()
    assert grid[1].split()[2:] == ["0F0", "0F1", ".", ".", "0B0", "0B1"]
    assert grid[2].split()[2:] == [".", "1F0", "1F1", "1B0", "1B1", "."]


def test_split_backward_validates_and_lowered_input_is_accepted():
    s = schedule([(F, 0, 0), (I, 0, 0), (W, 0, 0)], [(F, 1, 0), (I, 1, 0), (W, 1, 0)], mb=1)
    assert validate(s).makespan == 5  # F F I I W on the critical path, W(0) last
    assert validate(add_p2p(s)).makespan == 5


@pytest.mark.parametrize("programs,mb,stages,needle", [
    # duplicate op
    ([[(F, 0, 0), (F, 0, 1), (F, 0, 1), (B, 0, 0), (B, 0, 1)]], 2, 1, "0F1 appears 2 times"),
    # missing backward
    ([[(F, 0, 0), (F, 0, 1), (B, 0, 0)]], 2, 1, "0B1"),
    # missing forward
    ([[(F, 0, 0), (B, 0, 0), (B, 0, 1)]], 2, 1, "missing forward 0F1"),
    # I without W
    ([[(F, 0, 0), (I, 0, 0)]], 1, 1, "0W0"),
    # op on the wrong rank
    ([[(F, 0, 0), (F, 1, 0), (B, 0, 0)], [(B, 1, 0)]], 1, 2, "op 1F0 belongs to stage 1, "
                                                               "which lives on rank 1"),
    # microbatch out of range
    ([[(F, 0, 0), (F, 0, 5), (B, 0, 0)]], 1, 1, "op 0F5 names microbatch 5"),
    # stage out of range
    ([[(F, 0, 0), (F, 3, 0), (B, 0, 0)]], 1, 1, "op 3F0 names stage 3"),
])
def test_structural_errors_name_the_op(programs, mb, stages, needle):
    s = schedule(*programs, mb=mb, stages=stages)
    with pytest.raises(ConfigError, match=needle):
        validate(s)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]), st.integers(1, 4),
       st.integers(1, 3), st.randoms(use_true_random=False))
def test_dry_run_never_hangs_on_shuffled_programs(name, pp, groups, rng: random.Random):
    """Any order of a valid schedule's ops either runs or raises DeadlockError, fast."""
    vpp = 2 if name == "interleaved-1f1b" else 1
    s = build_schedule(name, pp, pp * groups, vpp)
    for program in s.programs:
        rng.shuffle(program)
    start = time.perf_counter()
    try:
        run = validate(s)
    except DeadlockError as err:
        assert err.stuck and all(f">{op}<" in err.report for op in err.stuck.values())
    else:
        assert sum(len(r) for r in run.steps) == 2 * pp * vpp * pp * groups
    assert time.perf_counter() - start < 5  # a hang, not a speed target (CI is loaded)
