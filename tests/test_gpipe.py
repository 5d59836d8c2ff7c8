"""GPipe against its closed forms: makespan 2(M+P-1) in unit steps, every rank holds all M
microbatches (Huang et al. 2019)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.registry import build_schedule
from clustersim.schedules.validate import validate
from schedule_levels import in_flight


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 24))
def test_gpipe_makespan_and_holds_all_microbatches(pp, mb):
    s = build_schedule("gpipe", pp, mb)
    assert validate(s).makespan == 2 * (mb + pp - 1)
    for program in s.programs:
        assert max(in_flight(program)) == mb
