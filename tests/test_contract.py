"""The execution contract's positional rules (schedules.contract) and chunked ops."""
import pytest

from schedules.contract import local_waits, program_contract, program_products
from schedules.errors import ConfigError, DeadlockError
from schedules.generators import build_schedule
from schedules.ops import Op, OpKind, parse_op
from schedules.p2p import add_p2p
from schedules.schedule import Schedule
from schedules.validate import dry_run, validate


def ops(text):
    return [parse_op(t) for t in text.split()]


def test_chunk_text_form_round_trips_and_joins_the_key():
    op = parse_op("0ALL_GATHER2.1")
    assert (op.kind, op.stage, op.microbatch, op.chunk) == (OpKind.ALL_GATHER, 0, 2, 1)
    assert str(op) == "0ALL_GATHER2.1" and str(parse_op("3F0")) == "3F0"
    assert parse_op("0F3.1").key == (OpKind.F, 0, 3, 1)
    assert parse_op("0F3").key == (OpKind.F, 0, 3)  # unchunked keys are unchanged


def test_positional_waits():
    program = ops("0ALL_GATHER0.0 0ALL_GATHER0.1 0F0.0 0F0.1 0B0.1 0REDUCE_SCATTER0.1 "
                  "0B0.0 0REDUCE_SCATTER0.0 0OPT_STEP 0ALL_GATHER")
    program = [Op(o.kind, o.stage, o.microbatch, None if o.kind.is_compute else "dp",
                  chunk=o.chunk) for o in program]
    waits = local_waits(program)
    assert waits[2] == (0,) and waits[3] == (1,)  # F of a group waits for its gather
    assert waits[4] == (1,)  # backward group 1 reuses the latest gather of group 1
    assert waits[5] == (4,) and waits[7] == (6,)  # scatter after its group's backward
    assert set(waits[8]) == {5, 7, 6}  # step: every scatter since, and the last backward
    assert waits[9] == (8,)  # gather of the updated parameters after the step
    products = program_products(program)
    assert (OpKind.F, 0, 0) in products[3] and (OpKind.F, 0, 0) not in products[2]
    assert (OpKind.I, 0, 0) in products[6]  # the last backward group completes the stage


def test_chained_gradient_collectives_on_other_groups():
    program = [Op(OpKind.B, 0, 0), Op(OpKind.REDUCE_SCATTER, 0, 0, "dp_shard"),
               Op(OpKind.ALL_REDUCE, 0, 0, "dp_replicate"), Op(OpKind.COPY_D2H, 0, 0, "pcie"),
               Op(OpKind.OPT_STEP, 0, None, "host"), Op(OpKind.COPY_H2D, 0, None, "pcie")]
    assert local_waits(program) == [(), (0,), (0, 1), (2,), (1, 2, 3, 0), (4,)]


def test_plain_programs_have_no_positional_waits():
    program = add_p2p(build_schedule("1f1b", 4, 8)).programs[1]
    contract = program_contract(program)
    assert all(w == () for w in contract.local) and contract.completes == {}


def test_chunked_schedule_validates_and_p2p_wraps_the_groups():
    programs = [ops("0F0.0 0F0.1 0B0.1 0B0.0"), ops("1F0.0 1F0.1 1B0.1 1B0.0")]
    schedule = Schedule("chunked", 1, programs, 2, layer_groups=2)
    lowered = add_p2p(schedule)
    assert " ".join(map(str, lowered.programs[0])) == "0F0.0 0F0.1 0SEND_F0 0RECV_B0 0B0.1 0B0.0"
    assert " ".join(map(str, lowered.programs[1])) == "1RECV_F0 1F0.0 1F0.1 1B0.1 1B0.0 1SEND_B0"
    assert dry_run(schedule).makespan == 8


def test_bad_chunk_structure_is_refused():
    with pytest.raises(ConfigError, match="layer groups"):
        validate(Schedule("x", 1, [ops("0F0.1 0F0.0 0B0.1 0B0.0")], 1, layer_groups=2))
    with pytest.raises(ConfigError, match="out of range"):
        validate(Schedule("x", 1, [ops("0F0.0 0F0.1 0B0")], 1))


def test_deadlock_with_data_parallel_ops_is_reported():
    """A whole-iteration reduce-scatter posted before the gradients exist never runs."""
    schedule = build_schedule("1f1b", 2, 2)
    early = Op(OpKind.REDUCE_SCATTER, 1, None, group="dp")
    schedule.programs[1] = [schedule.programs[1][0], early, *schedule.programs[1][1:],
                            Op(OpKind.OPT_STEP, 1)]
    with pytest.raises(DeadlockError) as err:
        validate(schedule)
    assert ">1REDUCE_SCATTER<" in err.value.report
