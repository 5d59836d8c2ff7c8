"""Looped BFS against torch.distributed.pipelining's own generator (ScheduleLoopedBFS's
per-rank order, when torch is installed) and against its memory closed form: every rank
holds all V*M microbatch-stages at its peak. Added through the registry alone
(schedules/pipelines/looped_bfs.py)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.registry import build_schedule
from clustersim.schedules.validate import validate
from schedule_levels import in_flight

SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 12), st.integers(1, 4))
def test_every_rank_holds_all_its_microbatch_stages_and_runs_to_the_end(pp, mb, vpp):
    s = build_schedule("ScheduleLoopedBFS", pp, mb, vpp)
    validate(s)
    for program in s.programs:
        assert max(in_flight(program)) == vpp * mb


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 12), st.integers(1, 4))
def test_the_order_of_every_rank_is_torchs(pp, mb, vpp):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ours = build_schedule("looped-bfs", pp, mb, vpp)
    for rank in range(pp):
        # torch's generator reads only these attributes of its schedule object
        fake = type("Looped", (), {"_stages": [None] * vpp, "pp_group_size": pp,
                                   "_n_microbatches": mb})()
        theirs = schedules.ScheduleLoopedBFS._calculate_single_rank_operations(fake, rank)
        # both print torch's _Action text form ('3F0'; a full backward is 'B')
        assert [str(op) for op in ours.programs[rank]] == [
            str(action) for action in theirs if action is not None]
