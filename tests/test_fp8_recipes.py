"""Transformer Engine's FP8 recipes (Megatron-LM --fp8-recipe / --fp8-format; issue 16 item
4): the casts each recipe runs, the FP8 copies TE keeps of its weights, the GEMM inputs it
saves in FP8, the amax all-reduces of current scaling, and the flags' refusals.

The oracle is a small GPT layer counted by hand from TE's rules (schedules.layer_kernels
and schedules.model.Fp8Recipe cite them): b 2, s 32, h 64, a 4, f 4h = 256, so T = 64
tokens, T*h = 4096, T*f = 16384 elements, and 4h^2 + 2hf = 49152 FP8-GEMM weights per
layer; 16-bit sources (2 bytes). Per-tensor copies are 1 byte; MXFP8 and blockwise
activation copies 1 + 1/32 bytes (an E8M0 byte per 32, an fp32 per 128), blockwise
weight copies 1 + 4/128^2."""
import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import layer_backward, layer_forward, recompute_forward
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.fp8 import check_fp8_device, fp8_notes
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.sim.simulate import simulate
from clustersim.topologies import get_device, load_topology

SMALL = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                  vocab_size=128, micro_batch_size=2, dtype="fp8")
TH, TF, W = 64 * 64, 64 * 256, 4 * 64 * 64 + 2 * 64 * 256  # T*h, T*f, weights per layer
M = 4  # microbatches per step


def layout(**fields) -> ParallelConfig:
    """SMALL's micro-batch size 2, one stage and M microbatches unless `fields` say."""
    return ParallelConfig(**{"pp": 1, "num_microbatches": M, "micro_batch_size": 2, **fields})


ONE, SP2 = layout(), layout(tp=2, sequence_parallel=True)
BLOCK = 1 + 1 / 32  # an MXFP8 or blockwise activation copy, bytes per element
BF16 = replace(SMALL, dtype="bf16", fp8_recipe=None, fp8_format=None)


def fp8(recipe: str, **fields) -> ModelSpec:
    return replace(SMALL, **{"fp8_recipe": recipe, "fp8_format": None, **fields})


def by_name(kernels) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in kernels:
        out[k.name] = out.get(k.name, 0.0) + k.nbytes
    return out


def fp8_part(kernels) -> dict[str, float]:
    """The FP8 kernels' bytes by name, and the norms' (which delayed scaling fuses)."""
    return {name: nbytes for name, nbytes in by_name(kernels).items()
            if name.startswith("fp8") or name == "norm"}


# --- settings and refusals ---------------------------------------------------------------

@pytest.mark.parametrize("recipe, te_format", [("delayed", "hybrid"), ("tensorwise", "hybrid"),
                                               ("mxfp8", "e4m3"), ("blockwise", "e4m3")])
def test_defaults_are_megatrons_recipe_and_tes_format(recipe, te_format):
    """Megatron-LM's --fp8-recipe defaults to delayed; --fp8-format has no default (it
    turns FP8 on), so a recipe takes its TE class's fp8_format default (recipe/__init__.py:
    DelayedScaling and Float8CurrentScaling HYBRID, MXFP8BlockScaling and
    Float8BlockScaling E4M3)."""
    assert SMALL.fp8_recipe == "delayed" and SMALL.fp8_format == "hybrid"
    assert fp8(recipe).fp8_format == te_format
    assert BF16.fp8 is None


@pytest.mark.parametrize("fields, message", [
    (dict(dtype="bf16", fp8_format=None), r"fp8_recipe='delayed' \(--fp8-recipe\) needs "
                                          r"dtype 'fp8' \(--dtype fp8\)"),
    (dict(dtype="bf16", fp8_recipe=None, fp8_format="e4m3"), r"\(--fp8-format\) needs"),
    (dict(fp8_recipe="custom"), r"fp8_recipe='custom' \(--fp8-recipe\) must be one of"),
    (dict(fp8_format="e5m2"), r"fp8_format='e5m2' \(--fp8-format\) must be one of"),
])
def test_bad_fp8_settings_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        replace(SMALL, **fields)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustersim", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("argv, message", [
    (["memory", "--model", "gpt3-1.3b", "--fp8-recipe", "tensorwise"],
     r"\(--fp8-recipe\) needs dtype 'fp8' \(--dtype fp8\), got 'bf16'"),
    (["memory", "--model", "gpt3-1.3b", "--fp8-format", "e4m3"], r"\(--fp8-format\) needs"),
    (["memory", "--model", "gpt3-1.3b", "--dtype", "fp8", "--fp8-recipe", "custom"],
     "invalid choice: 'custom'"),
    (["memory", "--model", "gpt3-1.3b", "--dtype", "fp8", "--fp8-recipe", "mxfp8",
      "--device", "h100"], "MXFP8 on Blackwell GPUs only .* not on the h100-sxm"),
    (["simulate", "--model", "gpt3-1.3b", "--num-layers", "2", "--pp", "1", "--dtype", "fp8",
      "--fp8-recipe", "mxfp8", "--topology", "dgx-h100", "-o", "{tmp}/g.html"],
     "--fp8-recipe mxfp8: .*Blackwell"),
])
def test_cli_refusals_are_one_line(argv, message, tmp_path):
    result = cli(*(arg.format(tmp=tmp_path) for arg in argv))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert re.search(message, result.stderr), result.stderr


@pytest.mark.parametrize("device, runs", [("b200", True), ("gb200", True), ("h100", False),
                                          ("h200", False), ("a100", False), ("mi300x", False)])
def test_mxfp8_runs_on_blackwell_only(device, runs):
    """TE's _compute_mxfp8_support: compute capability 10.x (Blackwell) only."""
    spec = get_device(device)
    mx = fp8("mxfp8")
    if runs:
        check_fp8_device(mx, spec.name, spec.compute_capability)
    else:
        with pytest.raises(ConfigError, match="Blackwell"):
            check_fp8_device(mx, spec.name, spec.compute_capability)
    for other in ("delayed", "tensorwise", "blockwise"):
        check_fp8_device(fp8(other), spec.name, spec.compute_capability)


def test_mxfp8_simulates_on_a_b200():
    timeline = simulate(fp8("mxfp8"), layout(), load_topology("dgx-b200"))
    assert timeline.iteration_time > 0


# --- the casts (layer_kernels.fp8_kernels) -----------------------------------------------

def test_delayed_scaling_casts_without_sequence_parallelism():
    """The norm writes the FP8 row-wise input of QKV and fc1 (read 2, write 1) and a
    transpose (read 1, write 1) the column-wise one; proj's and fc2's inputs, and every
    output gradient, go through one cast-transpose (read 2, write 1 + 1); the weights'
    cast-transpose once per step, a quarter of it per microbatch."""
    model = fp8("delayed")
    assert fp8_part(layer_forward(model, ONE)) == pytest.approx({
        "norm": 2 * (2 + 1) * TH, "fp8_transpose": 2 * 2 * TH,
        "fp8_cast": 4 * TH + 4 * TF, "fp8_weight_cast": 4 * W / M})
    grads = 3 * TH + TH + TF + TH  # QKV, proj, fc1, fc2 output gradients
    assert fp8_part(layer_backward(model, ONE)) == pytest.approx({
        "norm": 2 * 3 * 2 * TH, "fp8_cast": 4 * grads})


def test_current_scaling_reads_each_input_once_more_for_its_amax():
    """tensorwise: an amax pass (read 2) before each cast, but where the norm computed it
    (QKV's and fc1's inputs: Impl::FUSED_NORM_AMAX_FP8, the norm writes 16-bit output)."""
    model = fp8("tensorwise")
    assert fp8_part(layer_forward(model, ONE)) == pytest.approx({
        "norm": 2 * 4 * TH, "fp8_cast": 4 * (3 * TH + TF), "fp8_amax": 2 * (TH + TF),
        "fp8_weight_amax": 2 * W / M, "fp8_weight_cast": 4 * W / M})
    grads = 3 * TH + TH + TF + TH
    assert fp8_part(layer_backward(model, ONE)) == pytest.approx({
        "norm": 2 * 3 * 2 * TH, "fp8_amax": 2 * grads, "fp8_cast": 4 * grads})


@pytest.mark.parametrize("recipe, weight_copy", [("mxfp8", 1 + 1 / 32),
                                                 ("blockwise", 1 + 4 / 128 ** 2)])
def test_block_scaled_recipes_cast_both_copies_with_their_scales(recipe, weight_copy):
    """Each operand read once (2 bytes) and written twice with its block scales; the norm
    is not fused; no transposes."""
    model = fp8(recipe)
    assert fp8_part(layer_forward(model, ONE)) == pytest.approx({
        "norm": 2 * 4 * TH, "fp8_cast": (2 + 2 * BLOCK) * (3 * TH + TF),
        "fp8_weight_cast": (2 + 2 * weight_copy) * W / M})
    assert fp8_part(layer_backward(model, ONE)) == pytest.approx({
        "norm": 2 * 3 * 2 * TH, "fp8_cast": (2 + 2 * BLOCK) * (5 * TH + TF)})


def test_sequence_parallel_casts_the_shard_and_transposes_the_gathered_copy():
    """tp 2 with SP: QKV's and fc1's inputs (the norm's, delayed: already FP8) and proj's
    and fc2's output gradients (cast row-wise, read 2 write 1, on the rank's T*h/2 shard)
    are gathered, then transposed in the backward on all T*h; the others as without SP,
    on the rank's half."""
    model = fp8("delayed")
    half = TH // 2
    assert fp8_part(layer_forward(model, SP2)) == pytest.approx({
        "norm": 2 * 3 * half, "fp8_cast": 4 * half + 4 * TF / 2,
        "fp8_weight_cast": 4 * (W / 2) / M})
    assert fp8_part(layer_backward(model, SP2)) == pytest.approx({
        "norm": 2 * 3 * 2 * half, "fp8_transpose": 4 * 2 * TH,
        "fp8_cast": 4 * (3 * half) + 3 * half + 4 * TF / 2 + 3 * half})


def test_fp8_gemms_read_fp8_copies_and_write_16_bit():
    """MXFP8's QKV GEMM: input T*h and weights 3h^2 at 1 + 1/32 bytes, output 3T*h in 16
    bit."""
    qkv = next(k for k in layer_forward(fp8("mxfp8"), ONE) if k.name == "qkv_gemm")
    assert qkv.nbytes == pytest.approx(BLOCK * TH + BLOCK * 3 * 64 * 64 + 2 * 3 * TH)


def test_recompute_casts_the_inputs_again_but_not_the_weights():
    model = fp8("tensorwise")
    redo = by_name(recompute_forward(model, replace(ONE, recompute="full")))
    assert redo["fp8_cast"] == by_name(layer_forward(model, ONE))["fp8_cast"]
    assert "fp8_weight_cast" not in redo and "fp8_weight_amax" not in redo


def test_bf16_layers_run_no_fp8_kernel():
    names = {k.name for k in layer_forward(BF16, SP2) + layer_backward(BF16, SP2)}
    assert not {n for n in names if n.startswith("fp8")}


# --- communication (schedules.tp_comms) --------------------------------------------------

LLAMA = get_model("llama3-8b", num_layers=4)
SP4 = ParallelConfig(tp=4, pp=2, sequence_parallel=True, num_microbatches=2)


def lowered(model, parallel):
    plan = resolve(model, parallel)
    return list(lower(plan.build_schedule(), plan).ops())


def tp_ops(ops, kind):
    return [op for op in ops if op.kind is kind and op.group == "tp"]


def test_current_scaling_all_reduces_an_amax_before_each_sequence_parallel_gather():
    """One fp32 all-reduce per TE layer all-gather: 4 layers x 2 blocks x (F + B) x 2
    microbatches = 32, 4 bytes each; delayed scaling posts none."""
    delayed = tp_ops(lowered(replace(LLAMA, dtype="fp8"), SP4), OpKind.ALL_REDUCE)
    current = tp_ops(lowered(replace(LLAMA, dtype="fp8", fp8_recipe="tensorwise"), SP4),
                     OpKind.ALL_REDUCE)
    assert sum(o.count for o in current) - sum(o.count for o in delayed) == 32
    assert sum(o.nbytes for o in current) - sum(o.nbytes for o in delayed) == 32 * 4


@pytest.mark.parametrize("recipe", ["mxfp8", "blockwise"])
def test_block_scaled_gathers_carry_scales_and_both_gradient_copies(recipe):
    """Per microbatch, the layers gather 8 inputs (row-wise, 1 + 1/32 bytes) in F and 8
    output gradients (both copies, 2 (1 + 1/32)) in B; the head's and embedding's
    gathers stay 16-bit."""
    tokens_h = LLAMA.micro_batch_size * LLAMA.seq_length * LLAMA.hidden_size
    ops = lowered(replace(LLAMA, dtype="fp8", fp8_recipe=recipe), SP4)
    gathered = sum(o.nbytes for o in tp_ops(ops, OpKind.ALL_GATHER))
    per_microbatch = 8 * BLOCK + 8 * 2 * BLOCK + 2 * 2
    assert gathered == pytest.approx(2 * per_microbatch * tokens_h, rel=1e-6)


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "mxfp8", "blockwise"])
def test_data_parallel_and_pipeline_traffic_stays_16_bit(recipe):
    parallel = ParallelConfig(pp=2, dp=2, num_microbatches=4)
    bf16, ops = lowered(LLAMA, parallel), lowered(replace(LLAMA, dtype="fp8",
                                                          fp8_recipe=recipe), parallel)
    for kind, group in ((OpKind.ALL_REDUCE, "dp"), (OpKind.SEND_F, "pp")):
        assert sum(o.nbytes for o in ops if o.kind is kind and o.group == group) == \
            sum(o.nbytes for o in bf16 if o.kind is kind and o.group == group) > 0


# --- memory ------------------------------------------------------------------------------

SB = 64  # s * b


@pytest.mark.parametrize("model, per_token_h", [
    (BF16, 34),  # K22 Table 2
    (fp8("delayed"), 27),  # QKV, proj, fc1 inputs h and fc2 input 4h at 1 byte: 7 fewer
    (fp8("mxfp8"), 27 + 7 / 32),  # and their E8M0 scales
    (fp8("blockwise"), 27 + 7 / 32),  # and their fp32 scales per 128
])
def test_te_saves_its_gemm_inputs_in_fp8(model, per_token_h):
    """K22's 34sbh + 5as^2b, the GEMM inputs of TE's layers (2sbh + 2sbh + 2sbh + 8sbh in
    16 bit) kept as one FP8 copy instead; with SP all of it / t."""
    scores = 5 * 4 * 32 * SB
    assert model.layer_activation_bytes() == pytest.approx(per_token_h * SB * 64 + scores)
    assert model.layer_activation_bytes(2, True) == pytest.approx(
        (per_token_h * SB * 64 + scores) / 2)


def test_flash_attention_keeps_its_16_bit_output_beside_projs_fp8_copy():
    flash = fp8("delayed", use_flash_attn=True)
    assert flash.layer_activation_bytes() == (27 + 2) * SB * 64


def test_an_moe_layers_fc1_input_stays_16_bit_for_the_router():
    """4 experts, top-2 of width f: per token the replicated part 2h*2 norm inputs + QKV
    input h*1 + fc1 (router) input h*2 + masks 2h, the TP-split part Q, K, V h*2 each,
    proj input h*1, GeLU input 2f*2, fc2 input 2f*1, and the scores 5as."""
    moe = fp8("delayed", num_experts=4, moe_router_topk=2)
    per_token = (4 * 64 + 64 + 2 * 64 + 2 * 64) + (3 * 2 * 64 + 64 + 2 * 512 + 512) + 5 * 4 * 32
    assert moe.layer_activation_bytes() == SB * per_token


@pytest.mark.parametrize("recipe, per_weight", [("delayed", 2), ("tensorwise", 2),
                                                ("mxfp8", 2 * (1 + 1 / 32)),
                                                ("blockwise", 2 * (1 + 4 / 128 ** 2))])
def test_te_keeps_fp8_copies_of_its_weights_beside_the_16_bit_ones(recipe, per_weight):
    """Two layers' FP8-GEMM weights (4h^2 + 2hf each, no bias, norm, embedding or head),
    two copies each; counted in the model states, not in the weights column."""
    (rank,) = rank_memory(resolve(fp8(recipe), ONE))
    (bf16,) = rank_memory(resolve(BF16, ONE))
    assert rank.fp8_weights == pytest.approx(per_weight * 2 * W)
    assert rank.parameters == bf16.parameters and rank.optimizer_states == bf16.optimizer_states
    assert rank.model_states_bytes == pytest.approx(bf16.model_states_bytes + rank.fp8_weights)


@pytest.mark.parametrize("reshard, layers", [(True, 2), (False, 4)])
def test_zero3_has_copies_of_the_gathered_units_only(reshard, layers):
    model = fp8("delayed", num_layers=4)
    parallel = layout(dp=2, zero_stage=3, reshard_after_forward=reshard)
    (rank,) = rank_memory(resolve(model, parallel))
    assert rank.fp8_weights == 2 * layers * W


# --- notes and the command line ----------------------------------------------------------

def test_notes_say_the_format_changes_numerics_only_and_what_the_recipe_charges():
    assert fp8_notes(BF16) == []
    e4m3 = fp8_notes(fp8("delayed", fp8_format="e4m3"))
    assert "fp8 format e4m3" in e4m3[0] and "numerics only" in e4m3[0]
    assert "DelayedScaling" in e4m3[1] and "transposes" in e4m3[1]
    assert "all-reduced over tp" in fp8_notes(fp8("tensorwise"), sequence_parallel=True)[1]
    assert "1/M" in e4m3[2] and "2 bytes per FP8-GEMM weight" in e4m3[2]


def test_the_format_changes_no_number():
    parallel = layout(pp=2, tp=2, sequence_parallel=True)
    topology = load_topology("dgx-h100")
    times = {fmt: simulate(fp8("delayed", fp8_format=fmt), parallel, topology).iteration_time
             for fmt in ("e4m3", "hybrid")}
    assert times["e4m3"] == times["hybrid"]
    current = simulate(fp8("tensorwise"), parallel, topology).iteration_time
    assert current > times["e4m3"]  # the amax passes and all-reduces take time


def test_memory_command_shows_the_fp8_copies_and_the_notes():
    args = ["memory", "--model", "gpt3-1.3b", "--dtype", "fp8", "--fp8-recipe", "blockwise",
            "--fp8-format", "hybrid", "--topology", "dgx-h100"]
    table = cli(*args)
    assert table.returncode == 0, table.stderr
    assert "fp8 w." in table.stdout and "note: fp8 format hybrid" in table.stdout
    data = json.loads(cli(*args, "--json").stdout)
    assert any("Float8BlockScaling" in note for note in data["config"]["notes"])
    assert data["ranks"][0]["fp8_weights"] > 0
