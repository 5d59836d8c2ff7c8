"""ZeRO-3 / FSDP / HSDP / ZeRO++ pass: op sequences, sizes, the Timeline, errors."""
import pytest

from clustersim.schedules.data_parallel import add_data_parallel
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.layer_groups import group_costs
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.validate import validate
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

MODEL = get_model("llama3-8b", num_layers=4)


def _program(m=2, shard=None, **kw):
    if shard is not None:  # the hybrid shard group, or the hpZ secondary partition
        kw["hpz_partition_size" if kw.get("hpz") else "shard_size"] = shard
    parallel = ParallelConfig(dp=16, num_microbatches=m, zero_stage=3, **kw)
    schedule = add_data_parallel(build_schedule("1f1b", 1, m), resolve(MODEL, parallel))
    validate(schedule)
    return parallel, schedule.programs[0]


def test_gather_before_every_group_prefetched_one_ahead_and_scatter_after_backward():
    parallel, program = _program()
    text = " ".join(str(op) for op in program)
    assert text.startswith("0ALL_GATHER0.0 0ALL_GATHER0.1 0F0.0 0ALL_GATHER0.2 0F0.1 "
                           "0ALL_GATHER0.3 0F0.2 0F0.3 ")  # prefetch: g+1 posted before g runs
    assert "0ALL_GATHER0.2 0B0.3 0REDUCE_SCATTER0.3 0ALL_GATHER0.1 0B0.2" in text
    counts = {k: sum(op.kind is k for op in program) for k in OpKind}
    groups, m = 4, 2
    assert counts[OpKind.ALL_GATHER] == 2 * groups * m  # before each F and again each B
    assert counts[OpKind.REDUCE_SCATTER] == groups * m
    assert counts[OpKind.OPT_STEP] == 1 and program[-1].kind is OpKind.OPT_STEP
    costs = group_costs(MODEL, parallel, [MODEL.num_layers], groups)[0]
    for op in program:
        if op.kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
            assert op.group == "dp" and op.nbytes == costs[op.chunk].grad_bytes


def test_no_reshard_after_forward_keeps_the_parameters_for_backward():
    _, program = _program(reshard_after_forward=False)
    assert sum(op.kind is OpKind.ALL_GATHER for op in program) == 4 * 2  # forward only
    for i, op in enumerate(program):  # each gather serves a forward group
        if op.kind is OpKind.ALL_GATHER:
            user = next(o for o in program[i + 1:] if o.kind.is_compute and o.chunk == op.chunk)
            assert user.kind is OpKind.F


def test_zero3_gathers_precede_each_group_on_the_timeline_and_memory_follows_them():
    parallel = ParallelConfig(dp=8, num_microbatches=1, zero_stage=3)
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100"))
    spans = [s for s in timeline.spans if s.rank == 0]
    gathers = {(s.op.microbatch, s.op.chunk, s.op.kind): s for s in spans if s.lane == "dp"}
    for s in spans:
        if s.lane == "compute" and s.op.kind in (OpKind.F, OpKind.B):
            own = [g for g in spans if g.op.kind is OpKind.ALL_GATHER and g.op.chunk == s.op.chunk
                   and g.end <= s.start + 1e-12]
            assert own, f"{s.op} ran before its parameters were gathered"
    memory = [m.nbytes for m in timeline.memory if m.rank == 0]
    assert max(memory) > memory[0] and memory[-1] < max(memory)  # gathered, then freed
    assert gathers


def test_hsdp_shards_in_the_node_and_all_reduces_across():
    parallel, program = _program(m=1, shard=8, fsdp="hybrid")
    groups = {(op.kind, op.group) for op in program if op.kind.is_collective}
    assert groups == {(OpKind.ALL_GATHER, "dp_shard"), (OpKind.REDUCE_SCATTER, "dp_shard"),
                      (OpKind.ALL_REDUCE, "dp_replicate")}
    for i, op in enumerate(program):
        if op.kind is OpKind.ALL_REDUCE:
            assert program[i - 1].kind is OpKind.REDUCE_SCATTER
            assert op.nbytes == program[i - 1].nbytes // 8  # the shard
    timeline = simulate(MODEL, parallel, load_topology("dgx-h100-x16-ndr"))
    sizes = {s.info["algorithm"] for s in timeline.spans if s.lane == "dp_replicate"}
    assert sizes


def test_hybrid_without_a_node_boundary_is_refused():
    parallel = ParallelConfig(dp=8, num_microbatches=1, fsdp="hybrid")
    with pytest.raises(ConfigError, match="no node boundary"):
        simulate(MODEL, parallel, load_topology("dgx-h100"))
    with pytest.raises(ConfigError, match="shard_size"):
        ParallelConfig(dp=8, fsdp="hybrid", shard_size=3)


def test_zero_plus_plus_bytes():
    """qwZ: int8 weights (1 byte/param) on the 'dp' gathers; hpZ: backward gathers in the
    node ('dp_shard', bf16); qgZ: int4 gradients (half a byte/param)."""
    parallel, program = _program(m=1, shard=8, quantized_weights=True, hpz=True,
                                 quantized_gradients=True)
    costs = group_costs(MODEL, parallel, [MODEL.num_layers], 4)[0]
    params = {g: c.param_count + c.tied_param_count for g, c in enumerate(costs)}
    forward = True
    for op in program:
        if op.kind is OpKind.B:
            forward = False
        if op.kind is OpKind.ALL_GATHER and op.group == "dp":
            assert op.nbytes == params[op.chunk]
        elif op.kind is OpKind.ALL_GATHER:
            assert op.group == "dp_shard" and op.nbytes == 2 * params[op.chunk]
        elif op.kind is OpKind.REDUCE_SCATTER:
            assert op.nbytes == -(-params[op.chunk] // 2)
    assert not forward
    psi = resolve(MODEL, parallel).stage_costs[0].grad_bytes
    dp_bytes = sum(op.nbytes for op in program if op.kind.is_collective and op.group == "dp")
    assert dp_bytes == pytest.approx(psi / 2 + psi / 4, abs=8)  # vs 3 Psi without ZeRO++


def test_the_head_gathers_the_tied_word_embedding_again():
    """pp 1, tied embeddings (GPT-3): the output layer reuses the word embedding, which
    the first layer group owns and reshards after its forward, so the last group's gather
    holds its layer, the final norm and the word embedding: 2 bytes x (12h^2 + 13h + 2h +
    V*h) (issue 14, item 5: the embedding was missing, 100.7 MB instead of 311 MB)."""
    from clustersim.schedules.lowering import lower
    from clustersim.schedules.plan import resolve

    model = get_model("gpt3-1.3b")
    h, v = model.hidden_size, model.vocab_size
    plan = resolve(model, ParallelConfig(dp=8, zero_stage=3, num_microbatches=1))
    lowered = lower(plan.build_schedule(), plan)
    last = plan.layer_groups - 1
    gathers = {op.nbytes for op in lowered.ops()
               if op.kind is OpKind.ALL_GATHER and op.chunk == last}
    assert gathers == {2 * (12 * h * h + 13 * h + 2 * h + v * h)}
    first = {op.nbytes for op in lowered.ops() if op.kind is OpKind.ALL_GATHER and op.chunk == 0}
    assert first == {2 * (12 * h * h + 13 * h + v * h + model.seq_length * h)}
