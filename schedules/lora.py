"""LoRA and QLoRA fine-tuning (ModelSpec.lora_rank, lora_target_modules, lora_base_dtype,
lora_double_quant): which linear layers get adapters, their shapes and parameters, how the
frozen base weights are stored, and the checks and notes of these settings. Units:
parameters (counts), bytes, bits.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", section 4.1):
an adapted (in x out) linear layer W keeps W frozen and trains A (in x r) and B (r x out),
y = x W + (alpha / r) x A B: r (in + out) trainable parameters per adapted matrix; alpha
scales numerics only. Targets are named as NVIDIA NeMo names Megatron-Core's linear layers
(nemo/collections/llm/peft/lora.py, LoRA.target_modules, default all four: linear_qkv,
linear_proj, linear_fc1, linear_fc2; one adapter on each fused matrix) or as Hugging Face
PEFT names a Llama layer's nn.Linear modules (LoraConfig.target_modules: q_proj, k_proj,
v_proj, o_proj, gate_proj, up_proj, down_proj; one adapter per unfused matrix, so
r=8 on q_proj, v_proj of Llama-2-7B trains PEFT's 32 x 2 x 8 x (4096 + 4096) =
4,194,304 parameters). The embedding, norms and output layer stay frozen (neither names
them by default), the adapters' dropout is 0 (both frameworks' default).

QLoRA (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", section 3):
the frozen linear weights of every layer are stored quantized (bitsandbytes Linear4bit /
Linear8bitLt; the embedding, norms, biases and output layer stay 16-bit, as
transformers keeps lm_head) and dequantized to the model dtype before each GEMM, in the
forward and again in the backward (BASE_DTYPES).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .errors import ConfigError, require_positive_int

NEMO_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
"""Megatron-Core's linear layers of a transformer layer, NeMo's LoRA target names and its
default target_modules (module docstring)."""
PEFT_TARGETS = {  # PEFT / Hugging Face Llama module name -> the Megatron layer it is part of
    "q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv",
    "o_proj": "linear_proj", "gate_proj": "linear_fc1", "up_proj": "linear_fc1",
    "down_proj": "linear_fc2",
}
FP32_BITS = 32


@dataclass(frozen=True)
class BaseDtype:
    """How bitsandbytes stores a frozen weight: `bits` per weight, and one absmax constant
    per `block` weights (0: per output row) of `scale_bits` (an fp32), which double
    quantization stores as an 8-bit float with an fp32 per `dq_block` constants."""

    bits: int
    block: int
    source: str
    scale_bits: int = FP32_BITS
    dq_bits: int = 0
    dq_block: int = 0

    def bits_per_weight(self, double_quant: bool, in_features: int) -> float:
        """Bits per stored weight with its share of the scales; QLoRA section 3: scales of
        32/64 = 0.5 bits, double-quantized 8/64 + 32/(64 x 256) = 0.127 bits."""
        block = self.block or in_features
        if double_quant:
            return self.bits + self.dq_bits / block + self.scale_bits / (block * self.dq_block)
        return self.bits + self.scale_bits / block


_BNB_4BIT = dict(bits=4, block=64, dq_bits=8, dq_block=256)
BASE_DTYPES = {
    "nf4": BaseDtype(source="QLoRA section 3: 4-bit NormalFloat, blocks of 64 "
                            "(bitsandbytes bnb_4bit_quant_type='nf4')", **_BNB_4BIT),
    "fp4": BaseDtype(source="bitsandbytes' 4-bit float (bnb_4bit_quant_type='fp4'), "
                            "QLoRA's blocks of 64", **_BNB_4BIT),
    "int8": BaseDtype(8, 0, "LLM.int8() (Dettmers et al. 2022; bitsandbytes Int8Params): "
                            "int8 weights, one fp32 absmax per output row"),
}
"""The frozen base weights' storage under QLoRA (lora_base_dtype). nf4 and fp4 differ in
numerics only. Their GEMMs are modelled as dequantize-then-16-bit GEMM, what
bitsandbytes runs for 4-bit weights in training; LLM.int8()'s forward runs an int8 GEMM
with 16-bit outliers instead, approximated so (its backward dequantizes, as modelled)."""


class LoraSettings(Protocol):
    """What this module reads of a ModelSpec (schedules.model)."""

    hidden_size: int
    ffn_hidden_size: int
    swiglu: bool
    lora_rank: int | None
    lora_target_modules: tuple[str, ...] | None
    lora_base_dtype: str | None
    lora_double_quant: bool | None

    @property
    def kv_hidden_size(self) -> int: ...


def base_linears(model: LoraSettings) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear weight of a dense layer, by its Megatron name: QKV h x
    (h + 2h_kv), out proj h x h, fc1 h x f (SwiGLU: gate and up, h x 2f), fc2 f x h."""
    h, f = model.hidden_size, model.ffn_hidden_size
    return {"linear_qkv": (h, h + 2 * model.kv_hidden_size), "linear_proj": (h, h),
            "linear_fc1": (h, (2 if model.swiglu else 1) * f), "linear_fc2": (f, h)}


def _peft_shape(model: LoraSettings, name: str) -> tuple[int, int]:
    """(in, out) of a PEFT-named matrix, a part of its Megatron layer."""
    h, f, hkv = model.hidden_size, model.ffn_hidden_size, model.kv_hidden_size
    return {"q_proj": (h, h), "k_proj": (h, hkv), "v_proj": (h, hkv), "o_proj": (h, h),
            "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}[name]


def adapters(model: LoraSettings) -> list[tuple[str, str, int, int]]:
    """(target, the Megatron layer it adapts, in, out) of each adapter of one layer; empty
    without LoRA."""
    if model.lora_rank is None:
        return []
    shapes = base_linears(model)
    return [(name, name, *shapes[name]) if name in shapes
            else (name, PEFT_TARGETS[name], *_peft_shape(model, name))
            for name in model.lora_target_modules]


def adapter_param_count(model: LoraSettings) -> int:
    """Trainable parameters of one layer's adapters, r (in + out) per adapted matrix."""
    return sum(model.lora_rank * (n_in + n_out) for _, _, n_in, n_out in adapters(model))


def stored_weight_bytes(model: LoraSettings, n_in: int, n_out: int, dtype_bytes: int) -> float:
    """Bytes of a frozen (n_in x n_out) weight as stored: the model dtype, or under QLoRA
    `bits` per weight plus their scales (BaseDtype)."""
    if model.lora_base_dtype is None:
        return dtype_bytes * n_in * n_out
    kind = BASE_DTYPES[model.lora_base_dtype]
    return n_in * n_out * kind.bits_per_weight(bool(model.lora_double_quant), n_in) / 8


def base_weight_bytes(model: LoraSettings, dtype_bytes: int) -> float:
    """Bytes of one layer's frozen linear weights as stored (stored_weight_bytes)."""
    return sum(stored_weight_bytes(model, i, o, dtype_bytes)
               for i, o in base_linears(model).values())


def check_lora(model: LoraSettings, is_moe: bool, dtype: str) -> None:
    """Refuse LoRA settings that change nothing or make no sense (one line naming the
    field and the rule), and fill in the defaults: NeMo's four targets, and double
    quantization for a 4-bit base (QLoRA's recipe)."""
    if model.lora_rank is None:
        for name in ("lora_target_modules", "lora_base_dtype", "lora_double_quant"):
            if getattr(model, name) is not None:
                raise ConfigError(f"{name} (--{name.replace('_', '-')}) needs LoRA: set "
                                  f"lora_rank (--lora-rank)")
        return
    require_positive_int("lora_rank", model.lora_rank)
    if is_moe:
        raise ConfigError("lora_rank: LoRA on a mixture-of-experts model (adapters on its "
                          "experts, frozen routed experts) is not modelled")
    if dtype == "fp8":
        raise ConfigError("lora_rank: LoRA under dtype 'fp8' (Transformer Engine's FP8 "
                          "casts of frozen weights) is not modelled: use bf16")
    _check_targets(model)
    _check_base_dtype(model)


def _check_targets(model: LoraSettings) -> None:
    """Targets: known names, each once, a fused layer not beside one of its parts, present
    in the model, and rank at most min(in, out) of every adapted matrix."""
    if model.lora_target_modules is None:
        object.__setattr__(model, "lora_target_modules", NEMO_TARGETS)
    targets = model.lora_target_modules
    if isinstance(targets, str) or not isinstance(targets, tuple) or not targets:
        raise ConfigError(f"lora_target_modules={targets!r} must be a non-empty tuple of "
                          f"layer names")
    for name in targets:
        if name not in NEMO_TARGETS and name not in PEFT_TARGETS:
            raise ConfigError(f"lora_target_modules: {name!r} is not a linear layer: choose "
                              f"from {', '.join(NEMO_TARGETS + tuple(PEFT_TARGETS))}")
        if targets.count(name) > 1:
            raise ConfigError(f"lora_target_modules names {name!r} twice")
        if PEFT_TARGETS.get(name) in targets:
            raise ConfigError(f"lora_target_modules names {name!r} and the fused "
                              f"{PEFT_TARGETS[name]} that holds it: adapt one of them")
    if "gate_proj" in targets and not model.swiglu:
        raise ConfigError("lora_target_modules: gate_proj is a SwiGLU layer's; this model's "
                          "MLP has no gate (swiglu off): use up_proj or linear_fc1")
    for name, _, n_in, n_out in adapters(model):
        if model.lora_rank > min(n_in, n_out):
            raise ConfigError(f"lora_rank={model.lora_rank} is above min(in, out) = "
                              f"{min(n_in, n_out)} of {name} ({n_in} x {n_out}): a rank-r "
                              f"update of it cannot have a higher rank")


def _check_base_dtype(model: LoraSettings) -> None:
    kind = model.lora_base_dtype
    if kind is not None and kind not in BASE_DTYPES:
        raise ConfigError(f"lora_base_dtype={kind!r} (--lora-base-dtype) must be one of "
                          f"{', '.join(BASE_DTYPES)}")
    if model.lora_double_quant is not None and (kind is None or BASE_DTYPES[kind].dq_bits == 0):
        raise ConfigError(f"lora_double_quant (--double-quant) quantizes the block scales of "
                          f"a 4-bit base (lora_base_dtype nf4 or fp4), got "
                          f"lora_base_dtype={kind!r}")
    if kind is not None and BASE_DTYPES[kind].dq_bits and model.lora_double_quant is None:
        object.__setattr__(model, "lora_double_quant", True)


def check_lora_layout(model: LoraSettings, zero_stage: int) -> None:
    """The one layout rule: ZeRO-3 / FSDP of a LoRA model (frozen shards gathered beside
    the adapters', as FSDP-QLoRA runs it) is not modelled (ParallelConfig.check_model)."""
    if model.lora_rank is not None and zero_stage == 3:
        raise ConfigError("zero_stage 3 (--zero 3 / --fsdp) with LoRA (--lora-rank) is not "
                          "modelled: ZeRO-1/2 shard the adapters' states")


def lora_notes(model: LoraSettings) -> list[str]:
    """What a run of a LoRA model assumed (none without LoRA)."""
    if model.lora_rank is None:
        return []
    notes = [f"LoRA r={model.lora_rank} on {', '.join(model.lora_target_modules)}: "
             f"{adapter_param_count(model):,} trainable parameters per layer; embedding, "
             f"norms and output layer frozen; alpha and dropout change numerics only"]
    if model.lora_base_dtype is not None:
        kind = BASE_DTYPES[model.lora_base_dtype]
        bits = kind.bits_per_weight(bool(model.lora_double_quant), model.hidden_size)
        dq = ", double-quantized scales" if model.lora_double_quant else ""
        notes.append(f"QLoRA base weights {model.lora_base_dtype}{dq} ({kind.source}; "
                     f"{bits:.3f} bits per weight{' at in = h' if not kind.block else ''}), "
                     f"dequantized before each GEMM in forward and backward")
    return notes
