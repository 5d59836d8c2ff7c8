"""The DP gradient all-reduce pass and its place in the execution contract."""
import pytest

from clustersim.schedules.data_parallel import add_dp_allreduce
from clustersim.schedules.errors import ConfigError, DeadlockError
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.ops import BACKWARD_KINDS, Op, OpKind
from clustersim.schedules.validate import validate


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


# --- the data-parallel passes (issue 5): op sequences, sizes, volumes, errors ------------
from collections import Counter  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from clustersim.schedules.data_parallel import ADAM_BYTES_PER_PARAM, add_data_parallel  # noqa: E402
from clustersim.schedules.data_parallel import gradient_dtype_notes  # noqa: E402
from clustersim.schedules.layer_groups import data_parallel_groups  # noqa: E402
from clustersim.schedules.model_presets import get_model  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.lowering import lower  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.schedules.dp_sizes import EXTRA_TENSORS, TENSORS_PER_LAYER  # noqa: E402
from clustersim.schedules.sharding import DEFAULT_BUCKET_BYTES  # noqa: E402
from clustersim.sim.simulate import simulate  # noqa: E402
from clustersim.topologies import load_topology  # noqa: E402

MODEL = get_model("llama3-8b", num_layers=8)
LAYER_BYTES = MODEL.layer_param_count(1, 1) * 2  # bf16 gradients of one layer


def _pass(pp=1, dp=4, m=4, **kw):
    parallel = ParallelConfig(pp=pp, dp=dp, num_microbatches=m, **kw)
    return parallel, add_data_parallel(build_schedule("1f1b", pp, m), resolve(MODEL, parallel))


def _stage_bytes(parallel, stage):
    return resolve(MODEL, parallel).stage_costs[stage].grad_bytes


def test_ddp_buckets_ride_on_the_last_microbatch_backward_in_reverse_layer_order():
    bucket = LAYER_BYTES  # one layer fills a bucket: a layer group per layer
    parallel, schedule = _pass(pp=2, bucket_bytes=bucket)
    assert schedule.layer_groups == 4 == data_parallel_groups(MODEL, parallel, [4, 4])
    validate(schedule)
    for rank, program in enumerate(schedule.programs):
        text = [str(op) for op in program]
        chunks = [op for op in program if op.kind is OpKind.B and op.chunk is not None]
        assert [op.chunk for op in chunks] == [3, 2, 1, 0]  # reverse layer order
        assert {op.microbatch for op in chunks} == {3}  # only the last microbatch splits
        first_reduce = next(i for i, op in enumerate(program) if op.kind is OpKind.ALL_REDUCE)
        assert text[first_reduce - 1] == f"{rank}B3.3"  # posted right after its group
        reduces = [op for op in program if op.kind is OpKind.ALL_REDUCE]
        assert all(op.group == "dp" and op.nbytes <= bucket + 1 for op in reduces)
        assert sum(op.nbytes for op in reduces) == _stage_bytes(parallel, rank)
        # every group's gradients in ceil(group bytes / bucket) buckets
        per_group = Counter(op.chunk for op in reduces)
        assert per_group[1] == per_group[2] == 1
        assert program[-1].kind is OpKind.OPT_STEP
        params = _stage_bytes(parallel, rank) // 2
        assert program[-1].nbytes == ADAM_BYTES_PER_PARAM * params


def test_ddp_without_overlap_reduces_after_the_whole_backward():
    parallel, schedule = _pass(pp=2, overlap_grad_reduce=False)
    for program in schedule.programs:
        last_compute = max(i for i, op in enumerate(program) if op.kind in BACKWARD_KINDS)
        reduces = [i for i, op in enumerate(program) if op.kind is OpKind.ALL_REDUCE]
        assert min(reduces) > last_compute
        by_size = -(-_stage_bytes(parallel, program[0].stage) // DEFAULT_BUCKET_BYTES)
        # no more buckets than parameter tensors (a bucket never splits a tensor)
        assert len(reduces) == min(by_size, TENSORS_PER_LAYER * 4 + EXTRA_TENSORS)
        assert all(op.chunk is None for op in program)
    validate(schedule)


@pytest.mark.parametrize("stage, overlap", [(1, True), (1, False), (2, True), (2, False)])
def test_zero_1_and_2_reduce_scatter_step_then_gather(stage, overlap):
    """Once per iteration, bucket by bucket during the last microbatch's backward with
    overlap_grad_reduce (Megatron's --overlap-grad-reduce, for its distributed optimizer
    too), else after the whole backward."""
    parallel, schedule = _pass(pp=1, zero_stage=stage, bucket_bytes=LAYER_BYTES,
                               overlap_grad_reduce=overlap)
    [program] = schedule.programs
    kinds = [op.kind for op in program]
    step = kinds.index(OpKind.OPT_STEP)
    scatters = [i for i, k in enumerate(kinds) if k is OpKind.REDUCE_SCATTER]
    gathers = [i for i, k in enumerate(kinds) if k is OpKind.ALL_GATHER]
    last_backward = max(i for i, k in enumerate(kinds) if k is OpKind.B)
    assert max(scatters) < step < min(gathers) and OpKind.ALL_REDUCE not in kinds
    if overlap:
        assert min(scatters) < last_backward
    else:
        assert min(scatters) > last_backward
    psi = _stage_bytes(parallel, 0)
    assert sum(program[i].nbytes for i in scatters) == psi == sum(program[i].nbytes for i in gathers)
    assert program[step].nbytes == ADAM_BYTES_PER_PARAM * (psi // 2) // 4  # 1/N of the states
    validate(schedule)


def test_one_rank_gets_only_its_optimizer_steps_and_the_pass_runs_once():
    schedule = build_schedule("1f1b", 2, 4)
    added = add_data_parallel(schedule, resolve(MODEL, ParallelConfig(pp=2, num_microbatches=4)))
    for before, after in zip(schedule.programs, added.programs):
        assert after[:len(before)] == before
        assert [(op.kind, op.group) for op in after[len(before):]] == [(OpKind.OPT_STEP, None)]
    # the pass runs once: a second run is refused, and the lowering (which accepts a
    # schedule at any stage) leaves the data-parallel ops it finds as they are
    parallel, once = _pass(pp=2)
    plan = resolve(MODEL, parallel)
    with pytest.raises(ConfigError, match="already has data-parallel ops"):
        add_data_parallel(once, plan)
    lowered = lower(once, plan)
    assert sorted(op.stage for op in lowered.ops() if op.kind is OpKind.OPT_STEP) == [0, 1]
    def shape(ops):
        return [(op.kind, op.stage, op.microbatch, op.group, op.chunk) for op in ops]

    assert shape(op for op in lowered.ops() if not op.kind.is_p2p) == shape(once.ops())


def _volume(timeline, rank=0):
    """Bytes one rank moves per step by the ring closed forms of nccl-tests: all-reduce
    2(n-1)/n S, all-gather and reduce-scatter (n-1)/n S, for its group of n ranks."""
    total = 0.0
    for span in timeline.spans:
        if span.rank != rank or not span.op.kind.is_collective:
            continue
        n = 4  # dp, one node: every group here is the whole dp group
        factor = 2 if span.op.kind is OpKind.ALL_REDUCE else 1
        total += factor * (n - 1) / n * span.op.nbytes
    return total


@pytest.mark.parametrize("zero, factor", [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_communication_volume_per_step_is_2_psi_or_3_psi_for_zero_3(zero, factor):
    """ZeRO paper section 7: DDP, ZeRO-1 and ZeRO-2 move 2 Psi per rank per step,
    ZeRO-3 3 Psi (one microbatch: ZeRO-3 gathers again for every microbatch)."""
    parallel = ParallelConfig(dp=4, num_microbatches=1, zero_stage=zero)
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100"))
    psi = resolve(MODEL, parallel).stage_costs[0].grad_bytes  # bytes of bf16 parameters
    assert _volume(timeline) == pytest.approx(factor * psi * 3 / 4, rel=1e-9)


def test_ddp_bucket_all_reduce_overlaps_the_backward_on_the_timeline():
    parallel = ParallelConfig(dp=4, num_microbatches=2)
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100"))
    last_b = max(s.end for s in timeline.spans if s.lane == "compute" and s.op.kind is OpKind.B)
    dp = [s for s in timeline.spans if s.lane == "dp" and s.rank == 0]
    assert min(s.start for s in dp) < last_b  # a bucket reduces while backward runs
    step = [s for s in timeline.spans if s.op.kind is OpKind.OPT_STEP and s.rank == 0]
    assert step and step[0].start >= max(s.end for s in dp)


@pytest.mark.parametrize("zero", [0, 1])
def test_a_rank_steps_once_all_its_chunks_gradients_are_reduced(zero):
    """Interleaved, two model chunks per rank: the rank's optimizer steps (one per chunk)
    start only after every gradient collective of both chunks has ended, as Megatron-LM's
    one optimizer over all chunks does (finalize_model_grads syncs every chunk before the
    step); a chunk's step once overlapped the other chunk's all-reduce."""
    parallel = ParallelConfig(pp=2, vpp=2, dp=4, num_microbatches=4, zero_stage=zero,
                              schedule="interleaved-1f1b")
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100"))
    gradient = OpKind.ALL_REDUCE if zero == 0 else OpKind.REDUCE_SCATTER
    for rank in {s.rank for s in timeline.spans}:
        spans = [s for s in timeline.spans if s.rank == rank]
        reduced = [s for s in spans if s.op.kind is gradient and s.op.group == "dp"]
        steps = [s for s in spans if s.op.kind is OpKind.OPT_STEP]
        assert {s.op.stage for s in reduced} == {s.op.stage for s in steps} and len(steps) == 2
        assert min(s.start for s in steps) >= max(s.end for s in reduced)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]), pp=st.sampled_from([1, 2, 4]),
       m_mult=st.integers(1, 3), zero=st.sampled_from([0, 1]),
       overlap=st.booleans(), split=st.booleans(), bucket=st.sampled_from([1, LAYER_BYTES, None]))
def test_passes_compose_with_any_pipeline_schedule(name, pp, m_mult, zero, overlap, split, bucket):
    """DDP and ZeRO-1 over gpipe / 1f1b / interleaved (with or without the zero-bubble
    I/W split): the result validates, replays without deadlock, and reduces every
    stage's gradients exactly once."""
    vpp = 2 if name == "interleaved-1f1b" else 1
    if pp == 1 and vpp > 1:
        return
    m = pp * m_mult
    schedule = build_schedule(name, pp, m, vpp)
    if split:
        schedule = schedule.with_programs([
            [x for op in p for x in ((Op(OpKind.I, op.stage, op.microbatch),
                                       Op(OpKind.W, op.stage, op.microbatch))
                                      if op.kind is OpKind.B else (op,))]
            for p in schedule.programs])
    parallel = ParallelConfig(pp=pp, vpp=vpp, dp=2, num_microbatches=m, zero_stage=zero,
                              schedule=name, overlap_grad_reduce=overlap, bucket_bytes=bucket)
    plan = resolve(MODEL, parallel, schedule=schedule)
    result = add_data_parallel(schedule, plan)
    validate(result)
    costs = plan.stage_costs
    assert len(costs) == pp * vpp
    kind = OpKind.ALL_REDUCE if zero == 0 else OpKind.REDUCE_SCATTER
    for s in range(pp * vpp):
        reduced = sum(op.nbytes for op in result.ops() if op.kind is kind and op.stage == s)
        assert reduced == costs[s].grad_bytes
        assert sum(op.kind is OpKind.OPT_STEP and op.stage == s for op in result.ops()) == 1
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100"), schedule=schedule)
    assert sum(sp.op.kind is OpKind.OPT_STEP for sp in timeline.spans) == pp * vpp


def test_zero3_volume_grows_with_microbatches_and_hsdp_follows_its_groups():
    """ZeRO-3 gathers twice and reduce-scatters once per microbatch: 3 M Psi (n-1)/n.
    HSDP over k = 8 ranks per node and r = 2 nodes: per microbatch 2 gathers and a
    reduce-scatter in the node, (k-1)/k Psi each, plus a ring all-reduce of the Psi/k
    shard across nodes, 2 (r-1)/r Psi/k."""
    parallel = ParallelConfig(dp=4, num_microbatches=3, zero_stage=3)
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100"))
    psi = resolve(MODEL, parallel).stage_costs[0].grad_bytes
    assert _volume(timeline) == pytest.approx(3 * 3 * psi * 3 / 4, rel=1e-9)
    parallel = ParallelConfig(dp=16, num_microbatches=1, fsdp="hybrid")
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100-x16-ndr"))
    moved = 0.0
    for span in timeline.spans:
        if span.rank == 0 and span.op.kind.is_collective:
            n = 8 if span.op.group == "dp_shard" else 2
            moved += (2 if span.op.kind is OpKind.ALL_REDUCE else 1) * (n - 1) / n * span.op.nbytes
    expected = 3 * psi * 7 / 8 + 2 * (1 / 2) * psi / 8
    assert moved == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("dtype, kw, noted", [
    ("bf16", dict(dp=4), True), ("bf16", dict(dp=1, cp=2), True),
    ("fp8", dict(dp=2), True), ("bf16", dict(dp=1), False),
    ("bf16", dict(tp=8, tp_mode="2.5d", tp_depth=2, micro_batch_size=4), True),
    ("fp16", dict(dp=4), False), ("fp32", dict(dp=4), False)])
def test_bf16_gradient_reductions_say_they_are_16_bit(dtype, kw, noted):
    """A bf16 (or fp8) run that reduces gradients says it reduces them in 2 bytes per
    parameter, which is what the pass moves, unlike Megatron-LM's fp32 default; fp16 and
    fp32 reduce in their own dtype (Megatron-LM too), and without data parallelism
    nothing is reduced (2.5D's depth slices reduce theirs: Plan.grad_group 'dp_dep')."""
    model = get_model("llama3-8b", num_layers=8, dtype=dtype,
                      micro_batch_size=kw.get("micro_batch_size", 1))
    plan = resolve(model, ParallelConfig(num_microbatches=4, **kw))
    notes = gradient_dtype_notes(plan)
    assert bool(notes) == noted
    if noted:
        assert "bf16 (2 B per parameter)" in notes[0] and "fp32" in notes[0]
        costs = plan.stage_costs[0]
        assert costs.grad_bytes == 2 * costs.param_count
