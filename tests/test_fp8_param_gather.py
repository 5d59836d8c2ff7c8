"""FP8 parameters (issue 16 item 4; ModelSpec.fp8_param_gather, Megatron-LM's
--fp8-param-gather, torchtitan's enable_fsdp_float8_all_gather): the data-parallel
parameter all-gathers move TE's linear weights at their FP8 copy bytes and everything
else in 16 bit, and the FP8 weights replace the 16-bit copy of those weights in memory.

Hand-computed for a 2-layer GPT (h 64, 4 heads, s 32, V 128, f 256, biases, LayerNorm,
tied embedding), tp = pp = 1:
- a layer: 12h^2 + 13h = 49,984 parameters, of which TE linear weights (QKV h*3h, out
  proj h^2, fc1 and fc2 h*f) 16,384 + 32,768 = 49,152;
- embedding (V + s) h = 10,240, final norm 2h = 128, the tied word embedding Vh = 8,192
  gathered again for the head under ZeRO-3 on one stage.
"""
import subprocess
import sys

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve

LAYER, FP8_LAYER, EMBEDDING, NORM, WORD = 49_984, 49_152, 10_240, 128, 8_192
STAGE = 2 * LAYER + EMBEDDING + NORM  # 110,336


def gpt(**kw) -> ModelSpec:
    kw.setdefault("dtype", "fp8")
    return ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                     vocab_size=128, **kw)


def zero(stage: int, **kw) -> ParallelConfig:
    return ParallelConfig(pp=1, dp=2, zero_stage=stage, num_microbatches=1, **kw)


def gathers(model: ModelSpec, parallel: ParallelConfig) -> list:
    plan = resolve(model, parallel)
    return [op for op in lower(plan.build_schedule(), plan).ops()
            if op.kind is OpKind.ALL_GATHER and op.group == "dp"]


def test_the_model_is_as_hand_computed():
    model = gpt()
    assert model.layer_param_count() == LAYER
    assert model.layer_fp8_weight_count() == FP8_LAYER
    assert model.param_count() == STAGE


@pytest.mark.parametrize("recipe, weight_bytes", [("delayed", 1), ("tensorwise", 1),
                                                  ("blockwise", 1 + 4 / 128 ** 2)])
def test_zero1_gathers_move_te_weights_in_fp8_and_the_rest_in_16_bit(recipe, weight_bytes):
    fp8 = 2 * FP8_LAYER
    plain = gathers(gpt(fp8_recipe=recipe), zero(1))
    assert sum(op.nbytes for op in plain) == 2 * STAGE == 220_672
    ops = gathers(gpt(fp8_recipe=recipe, fp8_param_gather=True), zero(1))
    expected = 2 * (STAGE - fp8) + fp8 * weight_bytes  # 122,368 per-tensor, +24 blockwise
    assert sum(op.nbytes for op in ops) == pytest.approx(expected, abs=1)
    assert sum(op.nbytes for op in ops) == {"blockwise": 122_392}.get(recipe, 122_368)


def test_overlapped_param_gathers_per_layer_group():
    """A 1 KB bucket makes one layer group per layer: group 0 gathers layer 0 and the
    embedding, group 1 layer 1 and the final norm."""
    ops = gathers(gpt(fp8_param_gather=True),
                  zero(1, overlap_param_gather=True, bucket_bytes=1000))
    by_group = {g: sum(op.nbytes for op in ops if op.chunk == g) for g in (0, 1)}
    assert by_group == {0: 2 * (LAYER + EMBEDDING) - FP8_LAYER,  # 71,296
                        1: 2 * (LAYER + NORM) - FP8_LAYER}  # 51,072
    assert by_group == {0: 71_296, 1: 51_072}


def test_zero3_unit_gathers_keep_the_tied_head_weight_16_bit():
    ops = [op for op in gathers(gpt(fp8_param_gather=True), zero(3))]
    sizes = {op.chunk: op.nbytes for op in ops}
    assert sizes == {0: 2 * (LAYER + EMBEDDING) - FP8_LAYER,
                     1: 2 * (LAYER + NORM + WORD) - FP8_LAYER}
    assert sizes == {0: 71_296, 1: 67_456}


def test_reduce_scatters_stay_16_bit():
    def scatters(model):
        plan = resolve(model, zero(1))
        return sum(op.nbytes for op in lower(plan.build_schedule(), plan).ops()
                   if op.kind is OpKind.REDUCE_SCATTER)
    assert scatters(gpt(fp8_param_gather=True)) == scatters(gpt()) == 2 * STAGE


def test_zero1_memory_drops_the_16_bit_copy_and_keeps_the_fp8_copies():
    (plain,) = rank_memory(resolve(gpt(), zero(1)))
    (fp8,) = rank_memory(resolve(gpt(fp8_param_gather=True), zero(1)))
    assert plain.parameters == 2 * STAGE
    assert fp8.parameters == 2 * (STAGE - 2 * FP8_LAYER) == 24_064
    assert fp8.fp8_weights == plain.fp8_weights == 2 * 2 * FP8_LAYER  # row + column-wise
    assert (fp8.gradients, fp8.optimizer_states) == (plain.gradients, plain.optimizer_states)


def test_zero3_memory_gathers_units_without_their_16_bit_te_weights():
    """Two units (current + prefetched) unsharded: 2 x 2 x 49,984 bytes, less their TE
    weights' 2 bytes each; the 16-bit shard stays (torchao keeps it)."""
    (plain,) = rank_memory(resolve(gpt(), zero(3)))
    (fp8,) = rank_memory(resolve(gpt(fp8_param_gather=True), zero(3)))
    assert plain.gathered_parameters == 2 * 2 * LAYER
    assert fp8.gathered_parameters == 2 * 2 * (LAYER - FP8_LAYER) == 3_328
    assert fp8.parameters == plain.parameters and fp8.fp8_weights == plain.fp8_weights


@pytest.mark.parametrize("kw, words", [
    (dict(dtype="bf16"), "needs dtype 'fp8'"),
    (dict(fp8_recipe="mxfp8"), "fp8_recipe='mxfp8' is not modelled"),
    (dict(num_experts=4), "num_experts set is not modelled"),
    (dict(fp8_param_gather=1), "must be a bool"),
])
def test_model_refusals(kw, words):
    kw.setdefault("fp8_param_gather", True)
    with pytest.raises(ConfigError, match=words):
        gpt(**kw)


@pytest.mark.parametrize("parallel, words", [
    (zero(0), "zero_stage >= 1"),
    (zero(3, quantized_weights=True), "quantized_weights=True is not modelled"),
    (zero(3, hpz=True, hpz_partition_size=2), "hpz=True is not modelled"),
    (zero(1, offload=True), "offload=True is not modelled"),
])
def test_layout_refusals(parallel, words):
    model = gpt(fp8_param_gather=True)
    with pytest.raises(ConfigError, match=words):
        gathers(model, parallel)
    with pytest.raises(ConfigError, match=words):
        rank_memory(resolve(model, parallel))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustersim", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_runs_and_refuses():
    common = ("--model", "llama3-8b", "--dtype", "fp8", "--tp", "2", "--pp", "2",
              "--dp", "2", "--num-microbatches", "2")
    for spelling in ("--fp8-param-gather", "--enable-fsdp-float8-all-gather"):
        run = cli("simulate", *common, "--zero-stage", "1", spelling)
        assert run.returncode == 0, run.stderr
    memory = cli("memory", *common, "--zero-stage", "1", "--fp8-param-gather")
    assert memory.returncode == 0 and "FP8 parameters (fp8_param_gather)" in memory.stdout
    refused = cli("memory", *common, "--fp8-param-gather")
    assert refused.returncode != 0
    assert "fp8_param_gather=True (--fp8-param-gather) needs" in refused.stderr
