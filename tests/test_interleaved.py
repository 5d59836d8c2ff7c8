"""Interleaved 1F1B against Megatron-LM (SC21): unit-step makespan 2(VM + P - 1), warm-up
2(P-r-1) + (V-1)P forwards, rank r holding chunks r, r+P, ... (loop placement)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.ops import OpKind
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.validate import validate

SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(st.integers(1, 8), st.integers(1, 6), st.integers(2, 4))
def test_interleaved_makespan_and_warmup_counts(pp, groups, vpp):
    mb = pp * groups
    s = build_schedule("interleaved-1f1b", pp, mb, vpp)
    assert validate(s).makespan == 2 * mb * vpp + 2 * (pp - 1)
    for rank, program in enumerate(s.programs):
        first_b = next(i for i, op in enumerate(program) if op.kind is OpKind.B)
        assert all(op.kind is OpKind.F for op in program[:first_b])
        warmup = min(2 * (pp - rank - 1) + (vpp - 1) * pp, mb * vpp)
        # the first steady-state 1F1B pair also runs its F before its B
        assert first_b == min(warmup + 1, mb * vpp)
        assert {op.stage for op in program} == {r * pp + rank for r in range(vpp)}


def test_default_vpp_is_two():
    assert build_schedule("interleaved", 2, 4).num_stages == 4
