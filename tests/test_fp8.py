"""dtype 'fp8' as Transformer Engine runs it (issue 14, item 13): FP8 GEMMs in TE's linear
layers over a bf16 model. TE casts a GEMM input to FP8 before the sequence-parallel
all-gather that feeds it (forward: the norm output of LayerNormLinear;
backward: the output gradient of a row-parallel layer, grad_output_preprocess); every
reduction, the embedding's and output layer's collectives, pipeline transfers, expert
all-to-alls and data-parallel traffic stay 16-bit. Checked against bf16 runs of the same
layout: what must halve halves, everything else is unchanged. Under the default recipe
(delayed scaling); the recipes apart: tests/test_fp8_recipes.py."""
from dataclasses import replace

import pytest

from clustersim.schedules.layer_kernels import FP8_GEMMS, Kernel
from clustersim.schedules.lowering import lower
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.sim.cost import ATTAINMENT, RooflineCost
from clustersim.topologies import get_device

LLAMA = get_model("llama3-8b", num_layers=4)
MIXTRAL = get_model("mixtral-8x7b", num_layers=4)


def ops(model, parallel, dtype):
    plan = resolve(replace(model, dtype=dtype), parallel)
    return [op for op in lower(plan.build_schedule(), plan).ops()]


def total(op_list, kind, group):
    return sum(op.nbytes for op in op_list if op.kind is kind and op.group == group)


def test_sequence_parallel_gathers_of_the_layers_move_fp8_and_reductions_bf16():
    parallel = ParallelConfig(tp=4, pp=2, sequence_parallel=True, num_microbatches=2)
    bf16, fp8 = ops(LLAMA, parallel, "bf16"), ops(LLAMA, parallel, "fp8")
    tokens_h = LLAMA.micro_batch_size * LLAMA.seq_length * LLAMA.hidden_size
    # per microbatch: each layer gathers 2 inputs in F and 2 output gradients in B; the
    # output layer's input gather (F, last stage) and the embedding's gradient gather
    # (B, first stage) are Megatron's own, 16-bit
    layer_gathers = 2 * 4 * 2 * 2  # 2 blocks x 4 layers x (F + B) x 2 microbatches
    outside = 2 * 2  # (head F + embedding B) x 2 microbatches
    assert total(bf16, OpKind.ALL_GATHER, "tp") == (layer_gathers + outside) * 2 * tokens_h
    assert total(fp8, OpKind.ALL_GATHER, "tp") == (layer_gathers + 2 * outside) * tokens_h
    assert total(fp8, OpKind.REDUCE_SCATTER, "tp") == total(bf16, OpKind.REDUCE_SCATTER, "tp")


def test_without_sequence_parallelism_fp8_saves_no_tensor_parallel_traffic():
    parallel = ParallelConfig(tp=4, num_microbatches=2)
    assert total(ops(LLAMA, parallel, "fp8"), OpKind.ALL_REDUCE, "tp") == \
        total(ops(LLAMA, parallel, "bf16"), OpKind.ALL_REDUCE, "tp") > 0


@pytest.mark.parametrize("model, parallel, kinds", [
    (LLAMA, ParallelConfig(pp=2, dp=2, num_microbatches=4),
     [(OpKind.ALL_REDUCE, "dp"), (OpKind.SEND_F, "pp"), (OpKind.SEND_B, "pp")]),
    (LLAMA, ParallelConfig(dp=2, zero_stage=1, num_microbatches=2),
     [(OpKind.REDUCE_SCATTER, "dp"), (OpKind.ALL_GATHER, "dp")]),
    (MIXTRAL, ParallelConfig(dp=4, ep=4, num_microbatches=2), [(OpKind.ALL_TO_ALL, "ep")]),
    (LLAMA, ParallelConfig(cp=2, num_microbatches=2), [(OpKind.ALL_GATHER, "cp")]),
], ids=["ddp-pp", "zero1", "ep", "cp"])
def test_other_traffic_stays_16_bit(model, parallel, kinds):
    bf16, fp8 = ops(model, parallel, "bf16"), ops(model, parallel, "fp8")
    for kind, group in kinds:
        assert total(fp8, kind, group) == total(bf16, kind, group) > 0, (kind, group)


def test_only_te_linear_gemms_run_at_the_fp8_rate():
    """By default an FP8 GEMM runs at the H100's maximum achievable FP8 matmul, 1402.6
    TFLOP/s (ml-engineering's MAMF table), a BF16 one at 794.5, each x the attainment."""
    h100 = get_device("h100")
    fp8, bf16 = RooflineCost(h100, "fp8"), RooflineCost(h100, "bf16")
    flops = 1e12
    for name in FP8_GEMMS:
        assert fp8.kernels_time([Kernel(name, flops, 0.0)]) == pytest.approx(
            flops / (1402.6e12 * ATTAINMENT), rel=1e-9)
        assert bf16.kernels_time([Kernel(name, flops, 0.0)]) == pytest.approx(
            flops / (794.5e12 * ATTAINMENT), rel=1e-9)
    for name in ("flash_attention", "logits_gemm", "router_gemm", "scores_bmm"):
        assert fp8.kernels_time([Kernel(name, flops, 0.0)]) == \
            bf16.kernels_time([Kernel(name, flops, 0.0)])
    assert h100.peak("fp8") == pytest.approx(2 * h100.peak("bf16"), rel=1e-4)  # datasheet


def test_fp8_keeps_16_bit_weights_and_gradients():
    """Megatron's FP8 training keeps bf16 parameters and gradients (TE casts the weights
    to FP8 for its GEMMs): the DP bytes and the 16-bit weights, gradients and optimizer
    states equal bf16's; TE's FP8 weight copies come on top (tests/test_fp8_recipes.py)."""
    assert replace(LLAMA, dtype="fp8").dtype_bytes == 2
    assert replace(LLAMA, dtype="fp8").gemm_input_bytes == 1
