"""Generators: every op once, on the right rank, in a valid order, with the closed-form
in-flight counts and unit-time makespans of the literature."""
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.generators import build_schedule, canonical_schedule_name
from clustersim.schedules.ops import OpKind
from clustersim.schedules.validate import validate

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def configs(draw):
    """(name, P, M, V) over P in 1..8, M in 1..24, V in 2..4 where the schedule allows."""
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]))
    pp = draw(st.integers(1, 8))
    if name == "interleaved-1f1b":
        return name, pp, pp * draw(st.integers(1, 24 // pp)), draw(st.integers(2, 4))
    return name, pp, draw(st.integers(1, 24)), 1


def in_flight(program):
    """Levels of microbatch-stages held, in program order (+1 at F, -1 at B)."""
    level, levels = 0, []
    for op in program:
        level += {OpKind.F: 1, OpKind.B: -1}[op.kind]
        levels.append(level)
    return levels


@SETTINGS
@given(configs())
def test_every_forward_and_backward_once_on_its_rank_in_order(config):
    name, pp, mb, vpp = config
    s = build_schedule(name, pp, mb, vpp)
    assert s.num_ranks == pp and s.num_stages == pp * vpp and s.num_microbatches == mb
    counts = Counter(op.key for op in s.ops())
    expected = {(k, st_, m) for k in (OpKind.F, OpKind.B)
                for st_ in range(pp * vpp) for m in range(mb)}
    assert set(counts) == expected and set(counts.values()) == {1}
    for rank, program in enumerate(s.programs):
        position = {op.key: i for i, op in enumerate(program)}
        for op in program:
            assert s.stage_ranks[op.stage] == rank
            if op.kind is OpKind.B:
                assert position[(OpKind.F, op.stage, op.microbatch)] < position[op.key]


@SETTINGS
@given(configs())
def test_validate_accepts_and_makespan_matches_closed_form(config):
    name, pp, mb, vpp = config
    makespan = validate(build_schedule(name, pp, mb, vpp)).makespan
    if name == "interleaved-1f1b":
        assert makespan == 2 * mb * vpp + 2 * (pp - 1)
    else:
        assert makespan == 2 * (mb + pp - 1)


@SETTINGS
@given(st.integers(1, 8), st.integers(1, 24))
def test_1f1b_in_flight_bound(pp, mb):
    s = build_schedule("1f1b", pp, mb)
    for rank, program in enumerate(s.programs):
        levels = in_flight(program)
        assert max(levels) == min(pp - rank, mb)
        first_b = next(i for i, op in enumerate(program) if op.kind is OpKind.B)
        assert first_b == min(pp - rank, mb)  # warm-up min(P-r-1, M) Fs, then F of 1F1B
        assert levels[-1] == 0


@SETTINGS
@given(st.integers(1, 8), st.integers(1, 24))
def test_gpipe_holds_all_microbatches(pp, mb):
    for program in build_schedule("gpipe", pp, mb).programs:
        assert max(in_flight(program)) == mb


@SETTINGS
@given(st.integers(1, 8), st.integers(1, 6), st.integers(2, 4))
def test_interleaved_warmup_counts(pp, groups, vpp):
    mb = pp * groups
    s = build_schedule("interleaved-1f1b", pp, mb, vpp)
    for rank, program in enumerate(s.programs):
        first_b = next(i for i, op in enumerate(program) if op.kind is OpKind.B)
        assert all(op.kind is OpKind.F for op in program[:first_b])
        warmup = min(2 * (pp - rank - 1) + (vpp - 1) * pp, mb * vpp)
        # the first steady-state 1F1B pair also runs its F before its B
        assert first_b == min(warmup + 1, mb * vpp)
        # Megatron's loop placement: rank r holds stages r, r+P, ...
        assert {op.stage for op in program} == {r * pp + rank for r in range(vpp)}


@pytest.mark.parametrize("args,field", [
    (("interleaved-1f1b", 4, 8, 1), "vpp"),
    (("1f1b", 4, 8, 2), "vpp"),
    (("gpipe", 4, 8, 2), "vpp"),
    (("interleaved-1f1b", 4, 6, 2), "microbatches"),
    (("1f1b", 0, 8, 1), "pp"),
    (("gpipe", -1, 8, 1), "pp"),
    (("1f1b", 4, 0, 1), "microbatches"),
    (("interleaved-1f1b", 4, 0, 2), "microbatches"),
    (("zb-h7", 4, 8, 1), "schedule"),
])
def test_bad_configs_name_the_field(args, field):
    with pytest.raises(ConfigError, match=field):
        build_schedule(*args)


@pytest.mark.parametrize("alias,name", [
    ("interleaved", "interleaved-1f1b"),
    ("Interleaved_1F1B", "interleaved-1f1b"),
    ("ScheduleInterleaved1F1B", "interleaved-1f1b"),
    ("Schedule1F1B", "1f1b"),
    ("1F1B", "1f1b"),
    ("pipedream-flush", "1f1b"),
    ("ScheduleGPipe", "gpipe"),
    (" GPipe ", "gpipe"),
])
def test_aliases_resolve(alias, name):
    assert canonical_schedule_name(alias) == name
    vpp = 2 if name == "interleaved-1f1b" else 1
    assert build_schedule(alias, 2, 4, vpp).programs == build_schedule(name, 2, 4, vpp).programs


def test_unknown_name_lists_choices():
    with pytest.raises(ConfigError, match="gpipe, 1f1b, interleaved-1f1b"):
        canonical_schedule_name("zbv-nope")
