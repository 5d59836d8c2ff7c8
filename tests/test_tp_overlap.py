"""--tp-comm-overlap as Megatron-LM runs it with Transformer Engine's userbuffers (issue 14,
item 9; TE's initialize_ub defaults): the all-gathers feeding a linear layer's GEMM and
the backward's reduce-scatters run beside the GEMMs, the forward's reduce-scatters are
pipelined in 4 chunks whose last one is exposed, the pipelined and bulk overlaps hold 16
SMs that their GEMMs then lack, and the embedding's, output layer's and cross-entropy's
collectives (Megatron's own layers) stay blocking. It used to hide every TP collective
for free."""
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.sim.cost import RooflineCost
from clustersim.sim.simulate import simulate
from clustersim.topologies import get_device, load_topology

LLAMA = get_model("llama3-8b", num_layers=4)
L = LLAMA.num_layers
TOKENS_H_BYTES = LLAMA.micro_batch_size * LLAMA.seq_length * LLAMA.hidden_size * 2


def tp_ops_of(kind, overlap=True):
    parallel = ParallelConfig(tp=8, sequence_parallel=True, num_microbatches=1,
                              tp_comm_overlap=overlap)
    plan = resolve(LLAMA, parallel)
    program = lower(plan.build_schedule(), plan).programs[0]
    at = next(i for i, op in enumerate(program) if op.kind is kind)
    before, after = [], []
    for op in program[:at][::-1]:  # posted right before it, to run beside it
        if op.group != "tp" or not op.alongside:
            break
        before.append(op)
    for op in program[at + 1:]:  # posted right after it, blocking
        if op.group != "tp" or op.alongside:
            break
        after.append(op)
    return before, after


def test_forward_hides_the_gathers_and_three_quarters_of_the_reduce_scatters():
    before, after = tp_ops_of(OpKind.F)
    gather = [op for op in before if op.kind is OpKind.ALL_GATHER]
    hidden = [op for op in before if op.kind is OpKind.REDUCE_SCATTER]
    tail = [op for op in after if op.kind is OpKind.REDUCE_SCATTER and op.count == 2 * L]
    # per layer: 2 all-gathers (QKV, FC1 inputs) and 2 reduce-scatters (proj, FC2 outputs)
    assert [(op.count, op.nbytes) for op in gather] == [(2 * L, 2 * L * TOKENS_H_BYTES)]
    assert [(op.count, op.nbytes) for op in hidden] == [(3 * 2 * L,
                                                         3 * 2 * L * TOKENS_H_BYTES // 4)]
    assert [(op.count, op.nbytes) for op in tail] == [(2 * L, 2 * L * TOKENS_H_BYTES // 4)]
    outside = {(op.kind, op.count) for op in after} - {(OpKind.REDUCE_SCATTER, 2 * L)}
    # the embedding's reduce-scatter, the output layer's all-gather, the cross-entropy's
    # three all-reduces: blocking, as without overlap
    assert outside == {(OpKind.REDUCE_SCATTER, 1), (OpKind.ALL_GATHER, 1),
                       (OpKind.ALL_REDUCE, 3)}


def test_backward_hides_its_gathers_and_reduce_scatters_entirely():
    before, after = tp_ops_of(OpKind.B)
    assert {(op.kind, op.count) for op in before} == {(OpKind.ALL_GATHER, 2 * L),
                                                     (OpKind.REDUCE_SCATTER, 2 * L)}
    assert {(op.kind, op.count) for op in after} == {(OpKind.ALL_GATHER, 1),
                                                    (OpKind.REDUCE_SCATTER, 1)}


def test_the_overlapped_gemms_run_on_the_sms_the_communication_leaves():
    """16 of an H100's 132 SMs go to the pipelined reduce-scatter: a compute-bound GEMM
    beside it takes 132/116 as long (TE's set_sm_margin)."""
    h100 = get_device("h100")
    roofline = RooflineCost(h100, "bf16", compute_efficiency=0.6)
    plan = resolve(LLAMA, ParallelConfig(tp=8, sequence_parallel=True, num_microbatches=1))
    kernels = plan.stage_costs[0].forward_kernels
    slowed = {"proj_gemm", "fc2_gemm"}
    plain = roofline.kernels_time(kernels)
    overlapped = roofline.kernels_time(kernels, frozenset(slowed), 16)
    gemms = sum(k.flops for k in kernels if k.name in slowed) / (h100.peak("bf16")
                                                                  * roofline.compute_efficiency)
    assert overlapped - plain == pytest.approx(gemms * (132 / 116 - 1), rel=1e-9)


def test_overlap_shortens_the_iteration_but_not_for_free():
    graph = load_topology("dgx-h100")
    runs = {ov: simulate(LLAMA, ParallelConfig(tp=8, sequence_parallel=True,
                                               num_microbatches=2, tp_comm_overlap=ov), graph)
            for ov in (False, True)}
    blocking, overlapped = runs[False], runs[True]
    exposed = {ov: sum(row["tp"] for row in run.time_breakdown().values())
               for ov, run in runs.items()}
    compute = {ov: sum(row["compute"] for row in run.time_breakdown().values())
               for ov, run in runs.items()}
    assert overlapped.iteration_time < blocking.iteration_time
    assert 0 < exposed[True] < exposed[False] / 3  # the tails and Megatron's own layers
    assert compute[True] > compute[False]  # the GEMMs beside the communication are slower
    tails = [s for s in overlapped.spans if s.op.kind is OpKind.REDUCE_SCATTER
             and not s.op.alongside and s.op.count == 2 * L]
    assert tails and all(s.op.microbatch is not None for s in tails)


def test_it_needs_sequence_parallelism_as_megatron_does():
    with pytest.raises(ConfigError, match="tp_comm_overlap=True.*needs sequence_parallel"):
        ParallelConfig(tp=2, tp_comm_overlap=True)


def test_the_kernels_refuse_it():
    pytest.importorskip("torch")
    from clustersim.kernels import KernelsError, run_schedule
    model = get_model("llama3-8b", num_layers=2, hidden_size=64, num_attention_heads=4,
                      num_query_groups=2, ffn_hidden_size=128, seq_length=16, vocab_size=128)
    plan = resolve(model, ParallelConfig(tp=2, sequence_parallel=True, tp_comm_overlap=True,
                                         num_microbatches=1))
    with pytest.raises(KernelsError, match="tp_comm_overlap"):
        run_schedule(plan.build_schedule(), plan)
