"""The DP gradient all-reduce pass and its place in the execution contract."""
import pytest

from schedules.data_parallel import add_dp_allreduce
from schedules.errors import DeadlockError
from schedules.generators import build_schedule
from schedules.ops import BACKWARD_KINDS, Op, OpKind
from schedules.validate import validate


@pytest.mark.parametrize("name, pp, m, vpp", [
    ("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved-1f1b", 2, 4, 3)])
def test_one_allreduce_per_stage_after_its_last_backward(name, pp, m, vpp):
    schedule = add_dp_allreduce(build_schedule(name, pp, m, vpp))
    for rank, program in enumerate(schedule.programs):
        reduces = [(i, op) for i, op in enumerate(program) if op.kind is OpKind.ALL_REDUCE]
        assert sorted(op.stage for _, op in reduces) == list(range(rank, pp * vpp, pp))
        for index, op in reduces:
            assert op.group == "dp"
            last_backward = max(i for i, o in enumerate(program)
                                if o.kind in BACKWARD_KINDS and o.stage == op.stage)
            assert index > last_backward
    assert add_dp_allreduce(schedule) is schedule  # idempotent
    validate(schedule)


def test_allreduce_posted_before_the_gradients_exist_is_a_deadlock():
    schedule = build_schedule("1f1b", 2, 2)
    early = Op(OpKind.ALL_REDUCE, 1, None, group="dp")
    schedule.programs[1] = [schedule.programs[1][0], early, *schedule.programs[1][1:]]
    with pytest.raises(DeadlockError) as err:
        validate(schedule)
    assert ">1ALL_REDUCE<" in err.value.report
