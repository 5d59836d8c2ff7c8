"""The execution contract's positional rules (schedules.contract) and chunked ops."""
import pytest

from clustersim.schedules.contract import local_waits, program_contract, program_products
from clustersim.schedules.errors import ConfigError, DeadlockError
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.ops import Op, OpKind, parse_op
from clustersim.schedules.p2p import add_p2p
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.validate import dry_run, validate


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


def _intra(text):
    """ops() with the group after '@' ('0ALL_REDUCE0@tp'), 'pp' on P2P ops; a trailing '+'
    marks an op that runs alongside the compute op after it ('1ALL_GATHER0@cp+')."""
    out = []
    for token in text.split():
        alongside = token.endswith("+")
        name, _, group = token.rstrip("+").partition("@")
        op = parse_op(name)
        group = group or ("pp" if op.kind.is_p2p else None)
        out.append(Op(op.kind, op.stage, op.microbatch, group, alongside=alongside))
    return out


def test_blocking_intra_layer_collectives_gate_the_next_compute_and_send():
    program = _intra("1RECV_F0 1F0 1ALL_REDUCE0@tp 1ALL_REDUCE0@tp 1SEND_F0 1RECV_B0 1B0 "
                     "1ALL_REDUCE0@tp 1SEND_B0")
    waits = local_waits(program)
    assert waits[1] == ()  # F waits for nothing local (its RECV is a keyed wait)
    assert waits[3] == (2,)  # one compute op's collectives run one after another
    assert waits[4] == (2, 3)  # SEND_F ships the reduced activation
    assert waits[6] == (2, 3)  # the next compute op waits for the previous op's collectives
    assert waits[8] == (7,)


def test_overlapped_collectives_run_alongside_their_compute_op():
    program = _intra("1RECV_F0 1ALL_GATHER0@cp+ 1F0 1ALL_REDUCE0@tp 1SEND_F0 1B0")
    waits = local_waits(program)
    assert waits[1] == (0,)  # after its compute op's inputs arrive
    assert waits[2] == ()  # F does not wait for its own ring
    assert set(waits[4]) == {1, 3} and set(waits[5]) == {1, 3}
    blocking = _intra("1RECV_F0 1ALL_GATHER0@cp 1F0 1ALL_REDUCE0@tp 1SEND_F0 1B0")
    assert local_waits(blocking)[2] == (1,)  # not alongside: a blocking op of nothing before


def test_one_group_can_have_an_alongside_op_and_an_exposed_tail():
    """TP overlap's pipelined reduce-scatter: most of it beside F (posted before), its last
    split blocking after F: the next compute op waits for both, F for neither."""
    program = _intra("1REDUCE_SCATTER0@tp+ 1F0 1REDUCE_SCATTER0@tp 1B0")
    waits = local_waits(program)
    assert waits[1] == () and waits[2] == ()
    assert set(waits[3]) == {0, 2}


def test_intra_layer_ops_with_repeated_keys_validate():
    programs = [_intra("0F0 0ALL_REDUCE0@tp 0B0 0ALL_REDUCE0@tp")]
    schedule = Schedule("tp", 1, programs, 1)
    assert validate(schedule).makespan == 2
