"""LoRA and QLoRA fine-tuning (issue 16 item 5; schedules/lora.py): adapters' parameters,
FLOPs, memory and data-parallel bytes against numbers worked out by hand from Hu et al.
2021 (r(in + out) per adapted matrix), Dettmers et al. 2023 (4-bit NormalFloat, 64-weight
blocks, 0.127 bits of double-quantized scales per weight), PEFT's published trainable
count and the frozen base's backward (input gradients only)."""
from dataclasses import replace

import pytest

from clustersim.kernels import KernelsError, run_schedule
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import layer_backward, layer_forward
from clustersim.schedules.lowering import lower
from clustersim.schedules.memory_model import rank_memory
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.names import DP_GROUPS
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.profile import model_shape
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.schedule import Schedule
from clustersim.sim.profile_cost import check_profile
from clustersim.sim.throughput import iteration_flops

from test_cli import clustersim
from test_profile import make_profile

# A small GPT layer: h 64, f 256 (4h, GeLU), 4 heads (MHA), s 16, b 2
SMALL = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16,
                  vocab_size=100, micro_batch_size=2)
# Llama-2-7B (Hugging Face meta-llama/Llama-2-7b-hf config.json): 32 layers, hidden 4096,
# SwiGLU 11008, 32 heads, vocabulary 32,000, untied, RMSNorm, no biases
LLAMA2_7B = ModelSpec(num_layers=32, hidden_size=4096, ffn_hidden_size=11008,
                      num_attention_heads=32, seq_length=4096, vocab_size=32000, swiglu=True,
                      normalization="RMSNorm", add_bias_linear=False,
                      position_embedding_type="rope", untie_embeddings_and_output_weights=True)
LLAMA2_LINEAR = 32 * (4 * 4096 ** 2 + 3 * 4096 * 11008)  # q, k, v, o, gate, up, down


def plan_of(model, **parallel):
    return resolve(model, ParallelConfig(**{"pp": 1, "num_microbatches": 2, **parallel,
                                            "micro_batch_size": model.micro_batch_size}))


def trainable(plan):
    return sum(c.param_count + c.tied_param_count for c in plan.stage_costs)


def frozen(plan):
    return sum(c.frozen_param_count for c in plan.stage_costs)


def test_adapter_parameters_of_a_small_model_by_hand():
    # NeMo's default targets: qkv 64 x 192, proj 64 x 64, fc1 64 x 256, fc2 256 x 64
    per_layer = 4 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))
    model = replace(SMALL, lora_rank=4)
    assert model.lora_target_modules == ("linear_qkv", "linear_proj", "linear_fc1",
                                         "linear_fc2")
    for pp in (1, 2):
        plan = plan_of(model, pp=pp)
        assert trainable(plan) == 2 * per_layer == 8192
        # every base weight, the embedding and (pp 2) the last stage's tied copy of it
        assert frozen(plan) == SMALL.param_count() + (pp - 1) * 100 * 64


def test_llama2_7b_r8_on_q_and_v_trains_peft_s_4194304_parameters():
    # PEFT's print_trainable_parameters for LoraConfig(r=8, target_modules=["q_proj",
    # "v_proj"]) on Llama-2-7B: "trainable params: 4,194,304 || all params: 6,742,609,920"
    model = replace(LLAMA2_7B, lora_rank=8, lora_target_modules=("q_proj", "v_proj"))
    plan = plan_of(model, pp=4, tp=2)
    assert trainable(plan) * 2 == 4_194_304  # per TP rank: half of each A and B
    assert frozen(replace(plan_of(model))) + 4_194_304 == 6_742_609_920


def test_qlora_nf4_base_bytes_are_the_paper_s_bits_per_weight():
    bits = 4 + 8 / 64 + 32 / (64 * 256)  # QLoRA section 3: 0.127 bits of scales
    assert bits == pytest.approx(4.127, abs=5e-4)
    other = LLAMA2_7B.param_count() - LLAMA2_LINEAR  # embeddings and norms, 16-bit
    for base, double, per_weight in (("nf4", None, bits), ("nf4", False, 4.5),
                                     ("fp4", True, bits)):
        model = replace(LLAMA2_7B, lora_rank=8, lora_base_dtype=base, lora_double_quant=double)
        stored = plan_of(model).stage_costs[0].frozen_weight_bytes
        assert stored == pytest.approx(LLAMA2_LINEAR * per_weight / 8 + 2 * other, rel=1e-12)


def test_qlora_int8_stores_a_byte_and_an_fp32_absmax_per_row():
    h, f = 4096, 11008  # rows (out) x (in + 4 bytes) per matrix
    per_layer = (3 * h * (h + 4) + h * (h + 4) + 2 * f * (h + 4) + h * (f + 4))
    model = replace(LLAMA2_7B, lora_rank=8, lora_base_dtype="int8")
    other = LLAMA2_7B.param_count() - LLAMA2_LINEAR
    assert plan_of(model).stage_costs[0].frozen_weight_bytes == 32 * per_layer + 2 * other


def test_a_frozen_layer_s_backward_runs_its_base_gemms_once():
    b, s, h, f, r = 2, 16, 64, 256, 4
    linear = 2 * b * s * (h * 3 * h + h * h + 2 * h * f)  # qkv, proj, fc1, fc2
    core = 4 * b * s * s * h
    adapter = 2 * b * s * r * (h + h)  # on linear_proj only: x A, then (xA) B
    model = replace(SMALL, lora_rank=r, lora_target_modules=("linear_proj",))
    assert model.layer_forward_flops() == linear + core + adapter
    assert model.layer_backward_flops() == linear + 2 * core + 2 * adapter
    assert SMALL.layer_backward_flops() == 2 * (linear + core)
    for tp in (1, 2):
        parallel = ParallelConfig(tp=tp, pp=1, num_microbatches=2)
        backward = sum(k.flops for k in layer_backward(model, parallel))
        assert backward == pytest.approx((linear + 2 * core + 2 * adapter) / tp)
        assert sum(k.flops for k in layer_forward(model, parallel)) == pytest.approx(
            (linear + core + adapter) / tp)


def test_qlora_dequantizes_every_base_weight_in_forward_and_backward():
    model = replace(LLAMA2_7B, lora_rank=8, lora_base_dtype="nf4", lora_double_quant=False)
    parallel = ParallelConfig(pp=1, num_microbatches=2)
    layer = LLAMA2_LINEAR / 32
    read_write = layer * 4.5 / 8 + 2 * layer  # packed weight + scales in, bf16 out
    for kernels in (layer_forward(model, parallel), layer_backward(model, parallel)):
        assert sum(k.nbytes for k in kernels if k.name == "dequantize") == pytest.approx(
            read_write)
    assert not [k for k in layer_forward(replace(model, lora_base_dtype=None,
                                                          lora_double_quant=None), parallel)
                if k.name == "dequantize"]


def test_iteration_flops_count_the_gemms_executed():
    model = replace(SMALL, lora_rank=4, lora_target_modules=("linear_proj",))
    logits = 2 * 2 * 16 * 64 * 100
    per_mb = 2 * (model.layer_forward_flops() + model.layer_backward_flops()) + 2 * logits
    plan = resolve(model, ParallelConfig(pp=1, num_microbatches=3, micro_batch_size=2))
    assert iteration_flops(plan) == (3 * per_mb, 3 * per_mb)
    assert model.iteration_flops(3) == 3 * per_mb


def test_activations_keep_only_the_inputs_adapters_read():
    b, s, h, a, r = 2, 16, 64, 4, 4
    sb = s * b
    full = sb * h * 34 + 5 * a * s * s * b  # Korthikanti et al. 2022 Table 2, no recompute
    assert SMALL.layer_activation_bytes() == full
    # LoRA on linear_proj only: the QKV and fc1 inputs (h each) and the fc2 input (4h) go,
    # 2 bytes each; the adapter's rank-r intermediate (2 bytes) comes
    model = replace(SMALL, lora_rank=r, lora_target_modules=("linear_proj",))
    assert model.layer_activation_bytes() == full - sb * 2 * (h + h + 4 * h) + sb * 2 * r


def test_data_parallel_reduces_and_shards_the_adapters_only():
    model = replace(SMALL, lora_rank=4)
    adapters = 2 * 1024 * 4
    plan = plan_of(model, dp=2)
    schedule = lower(plan.build_schedule(), plan)
    reduced = sum(op.nbytes for op in schedule.ops()
                  if op.kind is OpKind.ALL_REDUCE and op.group in DP_GROUPS)
    assert reduced == 2 * adapters  # bf16 gradients of the adapters, once per step
    memory = rank_memory(plan_of(model, dp=2, zero_stage=2))[0]
    assert memory.gradients == pytest.approx(2 * adapters / 2)
    assert memory.optimizer_states == pytest.approx(12 * adapters / 2)
    assert memory.parameters == pytest.approx(2 * adapters + 2 * SMALL.param_count())


@pytest.mark.parametrize("fields, rule", [
    (dict(lora_base_dtype="nf4"), "lora_base_dtype (--lora-base-dtype) needs LoRA"),
    (dict(lora_target_modules=("linear_qkv",)), "lora_target_modules"),
    (dict(lora_rank=0), "lora_rank must be an integer >= 1"),
    (dict(lora_rank=4, lora_target_modules=("gate_proj",)), "gate_proj is a SwiGLU"),
    (dict(lora_rank=4, lora_target_modules=("lm_head",)), "'lm_head' is not a linear layer"),
    (dict(lora_rank=4, lora_target_modules=("q_proj", "linear_qkv")), "and the fused"),
    (dict(lora_rank=4, lora_target_modules=("q_proj", "q_proj")), "twice"),
    (dict(lora_rank=65), "above min(in, out) = 64"),
    (dict(lora_rank=4, lora_base_dtype="int8", lora_double_quant=True), "lora_double_quant"),
    (dict(lora_rank=4, lora_double_quant=False), "lora_double_quant"),
    (dict(lora_rank=4, lora_base_dtype="nf3"), "must be one of nf4, fp4, int8"),
    (dict(lora_rank=4, dtype="fp8"), "dtype 'fp8'"),
])
def test_settings_that_change_nothing_or_make_no_sense_are_refused(fields, rule):
    with pytest.raises(ConfigError, match=rule.replace("(", r"\(").replace(")", r"\)")):
        replace(SMALL, **fields)


def test_lora_refuses_what_it_does_not_model():
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        get_model("mixtral-8x7b", lora_rank=8)
    with pytest.raises(ConfigError, match="zero_stage 3"):
        plan_of(replace(SMALL, lora_rank=4), dp=2, zero_stage=3)


def test_cli_memory_and_simulate_with_qlora(tmp_path):
    import json
    out = clustersim("memory", "--num-layers", "32", "--hidden-size", "4096",
                     "--ffn-hidden-size", "11008", "--num-attention-heads", "32",
                     "--seq-length", "4096", "--vocab-size", "32000", "--swiglu",
                     "--normalization", "RMSNorm", "--disable-bias-linear",
                     "--position-embedding-type", "rope",
                     "--untie-embeddings-and-output-weights", "--lora-rank", "8",
                     "--lora-target-modules", "q_proj,v_proj", "--qlora", "nf4", "--json")
    data = json.loads(out.stdout)
    rank = data["ranks"][0]
    assert rank["params"] == 4_194_304 and rank["frozen_params"] == 6_738_415_616
    assert rank["gradients"] == 2 * 4_194_304
    assert any("QLoRA" in note for note in data["config"]["notes"])
    run = clustersim("simulate", "--model", "llama3-8b", "--num-layers", "4", "--pp", "2",
                     "--microbatches", "4", "--lora-rank", "16", "--qlora", "nf4",
                     "-o", str(tmp_path / "g.html"))
    assert "throughput" in run.stdout
    bad = clustersim("memory", "--model", "llama3-8b", "--double-quant", check=False)
    assert bad.returncode != 0 and "needs LoRA" in bad.stderr


def test_what_lora_would_silently_get_wrong_is_refused():
    """The hardware backend trains every weight, a calibration profile times full
    training, and the I/W split halves a backward whose weight gradients are mostly
    frozen: each refuses LoRA in one line rather than price it wrong."""
    lora = replace(SMALL, lora_rank=4)
    one = build_schedule("1f1b", 1, 2)
    with pytest.raises(KernelsError, match="LoRA adapters and frozen"):
        run_schedule(one, plan_of(lora))
    profile = make_profile(model=model_shape(lora))
    with pytest.raises(ConfigError, match="a profile times layers whose every weight trains"):
        check_profile(profile, lora)
    f, i, w = OpKind.F, OpKind.I, OpKind.W  # zero-bubble style: I now, W later
    split = Schedule("split", 2, [[Op(f, 0, 0), Op(f, 0, 1), Op(i, 0, 0), Op(i, 0, 1),
                                   Op(w, 0, 0), Op(w, 0, 1)]], num_stages=1)
    with pytest.raises(ConfigError, match="LoRA with a split backward"):
        lower(split, plan_of(lora))
