"""add_p2p: one SEND/RECV pair per remote stage boundary, microbatch and direction."""
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.schedules.registry import build_schedule
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.p2p import add_p2p
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.validate import validate

F, B, I, W = OpKind.F, OpKind.B, OpKind.I, OpKind.W
SEND_F, RECV_F, SEND_B, RECV_B = OpKind.SEND_F, OpKind.RECV_F, OpKind.SEND_B, OpKind.RECV_B


@st.composite
def schedules(draw):
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]))
    pp = draw(st.integers(1, 6))
    if name == "interleaved-1f1b":
        return build_schedule(name, pp, pp * draw(st.integers(1, 3)), draw(st.integers(2, 4)))
    return build_schedule(name, pp, draw(st.integers(1, 8)))


@settings(max_examples=40, deadline=None)
@given(schedules())
def test_one_pair_per_boundary_microbatch_and_direction(s):
    lowered = add_p2p(s)
    boundaries = s.num_stages - 1 if s.num_ranks > 1 else 0
    for kind in (SEND_F, RECV_F, SEND_B, RECV_B):
        assert lowered.count(kind) == boundaries * s.num_microbatches
    sends = lowered.count(SEND_F) + lowered.count(SEND_B)
    assert sends == 2 * boundaries * s.num_microbatches
    assert sum(op.kind.is_p2p for op in lowered.ops()) == 4 * boundaries * s.num_microbatches
    assert all(op.group == "pp" for op in lowered.ops() if op.kind.is_p2p)
    assert lowered.compute_only().programs == s.programs
    validate(lowered)


@settings(max_examples=40, deadline=None)
@given(schedules())
def test_recv_right_before_consumer_and_send_right_after_producer(s):
    for rank, program in enumerate(add_p2p(s).programs):
        for i, op in enumerate(program):
            if not op.kind.is_p2p:
                continue
            assert s.stage_ranks[op.stage] == rank
            if op.kind is RECV_F:
                assert program[i + 1] == Op(F, op.stage, op.microbatch)
            elif op.kind is RECV_B:
                assert program[i + 1] == Op(B, op.stage, op.microbatch)
            elif op.kind is SEND_F:
                assert program[i - 1] == Op(F, op.stage, op.microbatch)
            else:
                assert program[i - 1] == Op(B, op.stage, op.microbatch)


def test_idempotent():
    s = build_schedule("interleaved-1f1b", 4, 8, 2)
    once = add_p2p(s)
    twice = add_p2p(once)
    assert twice.programs == once.programs
    assert add_p2p(once, boundary_bytes=lambda b: 7).programs == once.programs


def test_boundary_bytes_land_in_nbytes():
    s = build_schedule("1f1b", 4, 3)
    lowered = add_p2p(s, boundary_bytes=lambda stage: 1000 * (stage + 1))
    for op in lowered.ops():
        boundary = {SEND_F: op.stage, RECV_B: op.stage,
                    RECV_F: op.stage - 1, SEND_B: op.stage - 1}.get(op.kind)
        if boundary is None:
            assert op.nbytes == 0
        else:
            assert op.nbytes == 1000 * (boundary + 1)
    assert {op.nbytes for op in add_p2p(s).ops()} == {0}


def test_no_p2p_between_stages_that_share_a_rank():
    """Rank 0 holds stages 0-1, rank 1 holds 2-3: only the 1|2 boundary crosses ranks."""
    mb = 3
    programs = [
        [Op(F, s, m) for m in range(mb) for s in (0, 1)]
        + [Op(B, s, m) for m in range(mb) for s in (1, 0)],
        [Op(F, s, m) for m in range(mb) for s in (2, 3)]
        + [Op(B, s, m) for m in range(mb) for s in (3, 2)],
    ]
    s = Schedule("blocked", mb, programs, 4, stage_ranks=(0, 0, 1, 1))
    lowered = add_p2p(s)
    p2p = [op for op in lowered.ops() if op.kind.is_p2p]
    assert len(p2p) == 4 * mb
    assert {(op.kind, op.stage) for op in p2p} == {
        (SEND_F, 1), (RECV_B, 1), (RECV_F, 2), (SEND_B, 2)}
    validate(lowered)


def test_single_rank_interleaved_has_no_p2p():
    s = build_schedule("interleaved-1f1b", 1, 3, 3)
    assert not add_p2p(s).has_p2p and add_p2p(s).programs == s.programs


def test_split_backward_gets_its_recv_and_send_around_the_input_grad():
    s = Schedule("split", 1, [[Op(F, 0, 0), Op(I, 0, 0), Op(W, 0, 0)],
                              [Op(F, 1, 0), Op(I, 1, 0), Op(W, 1, 0)]], 2)
    lowered = add_p2p(s, boundary_bytes=lambda b: 64)
    assert [str(op) for op in lowered.programs[0]] == ["0F0", "0SEND_F0", "0RECV_B0", "0I0", "0W0"]
    assert [str(op) for op in lowered.programs[1]] == ["1RECV_F0", "1F0", "1I0", "1SEND_B0", "1W0"]
    assert all(op.nbytes == 64 for op in lowered.ops() if op.kind.is_p2p)
