"""1F1B against its closed forms: makespan 2(M+P-1) in unit steps, rank r holds
min(P-r, M) microbatches after min(P-r-1, M) warm-up forwards (Narayanan et al. 2021)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.ops import OpKind
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.validate import validate
from schedule_levels import in_flight

SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(st.integers(1, 8), st.integers(1, 24))
def test_1f1b_makespan_and_in_flight_bound(pp, mb):
    s = build_schedule("1f1b", pp, mb)
    assert validate(s).makespan == 2 * (mb + pp - 1)
    for rank, program in enumerate(s.programs):
        levels = in_flight(program)
        assert max(levels) == min(pp - rank, mb)
        first_b = next(i for i, op in enumerate(program) if op.kind is OpKind.B)
        assert first_b == min(pp - rank, mb)  # warm-up min(P-r-1, M) Fs, then F of 1F1B
        assert levels[-1] == 0
