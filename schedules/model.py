"""ModelSpec: a decoder-only transformer's shape, the single source of its FLOPs, bytes and
parameter counts. Field names follow Megatron-LM's flags. Units: FLOPs (multiply-add = 2),
bytes, parameters (counts).

Sources:
- FLOPs: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  using Megatron-LM", SC21 (hereafter SC21), section 5.1 and appendix: a layer's forward
  is 24bsh^2 + 4bs^2h, backward twice the forward, logits 2bshV; eq. (3).
- Parameters: SC21 eq. (2), 12lh^2(1 + 13/(12h) + (V+s)/(12lh)).
- Activations: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", 2022 (hereafter K22), section 4 and Table 2.
- Mixture of experts (Megatron-Core's MoE flags): a token runs the router and top-k of E
  routed experts (FLOPs, activations) while every expert counts as a parameter; shared
  experts run for every token; the first `moe_first_dense_layers` layers may be dense.
Notation: b micro-batch, s sequence, h hidden, f ffn hidden, a heads, V vocab,
h_kv = num_query_groups * h / a (K and V width under grouped-query attention),
E experts, k top-k, f_e expert ffn hidden, f_sh shared-expert ffn hidden.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError, require_positive_int
from .fp8 import DEFAULT_FP8_RECIPE, FP8_FORMATS, FP8_RECIPES, Fp8Recipe
from .limits import MAX_LAYERS, check_dimension
from .lora import NEMO_TARGETS, adapter_param_count, adapters, base_weight_bytes, check_lora

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
"""Bytes of a stored element. 'fp8' is Transformer Engine's FP8 training over a bf16 model
(Megatron-LM --bf16 --fp8-format, ModelSpec.fp8_recipe): weights, gradients, optimizer
states and communication stay 16-bit but for the sequence-parallel all-gathers that feed
TE's GEMMs (schedules.tp_comms) and, with ModelSpec.fp8_param_gather, TE's linear weights
and their data-parallel all-gathers (schedules.dp_sizes); the GEMMs of TE's linear layers
(layer_kernels.FP8_GEMMS) read FP8 copies of their inputs and weights, which casting kernels make
(layer_kernels.fp8_kernels), TE keeps the FP8 copies of its weights
(schedules.memory_model) and saves its GEMM inputs for the backward in FP8
(layer_activation_bytes)."""


NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")
RECOMPUTE = ("none", "selective", "full")
DEFAULT_MOE_TOPK = 2  # Megatron-LM's --moe-router-topk default


def default_ffn_hidden_size(hidden_size: int, swiglu: bool) -> int:
    """Megatron-LM's --ffn-hidden-size default (arguments.py, validate_args): 4h, or with
    SwiGLU int(4h * 2/3 / 64) * 64, the 8h/3 that keeps the parameters of two up
    projections near 4h's, rounded down to a multiple of 64."""
    if swiglu:
        return int(4 * hidden_size * 2 / 3 / 64) * 64
    return 4 * hidden_size


@dataclass(frozen=True)
class ModelSpec:
    """A GPT/Llama-style decoder. The field defaults are Megatron-LM's argument defaults:
    `ffn_hidden_size` 4*hidden_size (SwiGLU: default_ffn_hidden_size), `num_query_groups`
    num_attention_heads (multi-head attention), GeLU, LayerNorm, biases, learned absolute
    positions, tied embeddings, no flash attention; `dtype` is bf16 (Megatron's is fp32
    unless --bf16; runs at scale train in bf16). ffn and query groups are filled in
    by __post_init__, so equal shapes compare equal (`get_model` re-derives them when their
    source is overridden; `dataclasses.replace` does not). MoE: `num_experts` routed experts
    per MoE layer, each token routed to `moe_router_topk` of them (default 2, as in
    Megatron-LM); each expert is an MLP of width `moe_ffn_hidden_size` (default
    ffn_hidden_size, filled in); `moe_shared_expert_intermediate_size` is the total width
    of the shared experts every token runs (Megatron's flag; None: none); the first
    `moe_first_dense_layers` layers are dense MLPs of width ffn_hidden_size (Hugging Face's
    `first_k_dense_replace`, Megatron's `--moe-layer-freq [0]*k+[1]*(l-k)`; default 0).
    Per-layer methods take `layer` (0-based); None means the model's repeating layer
    (an MoE layer when the model has experts). FP8 (dtype 'fp8' only): `fp8_recipe`, one
    of FP8_RECIPES (default 'delayed', Megatron's), and `fp8_format`, one of FP8_FORMATS
    (default: the recipe's TE default), filled in; `fp8_param_gather` (Megatron-LM's
    --fp8-param-gather, torchtitan's enable_fsdp_float8_all_gather): FP8 parameters
    (_check_fp8). LoRA / QLoRA (schedules.lora):
    `lora_rank` r (None: every weight trains), `lora_target_modules` (NeMo's or PEFT's
    names; default NeMo's four), `lora_base_dtype` (None: the frozen base in `dtype`;
    nf4, fp4 or int8: QLoRA) and `lora_double_quant` (4-bit only; default on), filled in.
    `fused_elementwise` (default True): Megatron/TE's fused norm, activation, RoPE and
    bias-dropout-add kernels; False: PyTorch eager without torch.compile, each elementwise
    op its own kernel, as torchtitan's Llama runs them (layer_kernels.EAGER_OPS)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int
    ffn_hidden_size: int | None = None
    num_query_groups: int | None = None
    micro_batch_size: int = 1
    dtype: str = "bf16"
    swiglu: bool = False
    add_bias_linear: bool = True
    normalization: str = "LayerNorm"
    position_embedding_type: str = "learned_absolute"
    untie_embeddings_and_output_weights: bool = False
    use_flash_attn: bool = False
    fused_elementwise: bool = True
    num_experts: int | None = None
    moe_router_topk: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_first_dense_layers: int = 0
    fp8_format: str | None = None
    fp8_recipe: str | None = None
    fp8_param_gather: bool = False
    lora_rank: int | None = None
    lora_target_modules: tuple[str, ...] | None = None
    lora_base_dtype: str | None = None
    lora_double_quant: bool | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size",
                               default_ffn_hidden_size(self.hidden_size, self.swiglu))
        if self.num_query_groups is None:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                     "vocab_size", "ffn_hidden_size", "num_query_groups", "micro_batch_size"):
            require_positive_int(name, getattr(self, name))
            check_dimension(name, getattr(self, name))
        if self.num_layers > MAX_LAYERS:
            raise ConfigError(f"num_layers={self.num_layers} is above the limit of "
                              f"{MAX_LAYERS:,} (schedules.limits.MAX_LAYERS; the largest "
                              f"published models have about 200)")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size={self.hidden_size} must be divisible by "
                              f"num_attention_heads={self.num_attention_heads}")
        if self.num_attention_heads % self.num_query_groups:
            raise ConfigError(f"num_attention_heads={self.num_attention_heads} must be divisible "
                              f"by num_query_groups={self.num_query_groups}")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"dtype={self.dtype!r} is unknown: choose one of "
                              f"{', '.join(DTYPE_BYTES)}")
        self._check_fp8()
        if self.normalization not in NORMALIZATIONS:
            raise ConfigError(f"normalization={self.normalization!r} must be one of "
                              f"{', '.join(NORMALIZATIONS)}")
        if self.position_embedding_type not in POSITION_EMBEDDINGS:
            raise ConfigError(f"position_embedding_type={self.position_embedding_type!r} must "
                              f"be one of {', '.join(POSITION_EMBEDDINGS)}")
        for name in ("swiglu", "add_bias_linear", "untie_embeddings_and_output_weights",
                     "use_flash_attn", "fused_elementwise"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not self.fused_elementwise and self.dtype == "fp8":
            raise ConfigError("fused_elementwise=False (--eager-elementwise) with dtype 'fp8' is "
                              "not modelled: Transformer Engine's FP8 layers fuse the norm")
        if self.num_experts is None:
            for name in ("moe_router_topk", "moe_ffn_hidden_size",
                         "moe_shared_expert_intermediate_size"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{name} is set but num_experts is not: set both for a "
                                      f"mixture-of-experts model")
            if self.moe_first_dense_layers != 0:
                raise ConfigError("moe_first_dense_layers is set but num_experts is not: set "
                                  "both for a mixture-of-experts model")
        else:
            require_positive_int("num_experts", self.num_experts)
            if self.moe_router_topk is None:
                object.__setattr__(self, "moe_router_topk",
                                   min(DEFAULT_MOE_TOPK, self.num_experts))
            require_positive_int("moe_router_topk", self.moe_router_topk)
            if self.moe_router_topk > self.num_experts:
                raise ConfigError(f"moe_router_topk={self.moe_router_topk} must be <= "
                                  f"num_experts={self.num_experts}")
            if self.moe_ffn_hidden_size is None:
                object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
            require_positive_int("moe_ffn_hidden_size", self.moe_ffn_hidden_size)
            if self.moe_shared_expert_intermediate_size is not None:
                require_positive_int("moe_shared_expert_intermediate_size",
                                     self.moe_shared_expert_intermediate_size)
            dense = self.moe_first_dense_layers
            if isinstance(dense, bool) or not isinstance(dense, int) \
                    or not 0 <= dense < self.num_layers:
                raise ConfigError(f"moe_first_dense_layers={dense!r} must be an integer in "
                                  f"[0, num_layers={self.num_layers}): at least one layer "
                                  f"must be an MoE layer")
        check_lora(self, self.is_moe, self.dtype)

    def _check_fp8(self) -> None:
        """FP8 settings only with dtype 'fp8', where their defaults are filled in.

        `fp8_param_gather`: TE's linear weights (layer_fp8_weight_count) are FP8 tensors
        (Megatron-LM --fp8-param-gather, "keep the compute param in fp8 ... and perform
        the param all-gather in fp8", training/arguments.py; built under TE's
        fp8_model_init / quantized_model_init): no 16-bit copy of them, the optimizer's
        fp32 master weights cast into them after each step (core/fp8_utils.py
        quantize_param_shard), the data-parallel gathers moving their row-wise copy,
        Fp8Recipe.weight_bytes each, and the column-wise one made after the gather (TE
        pytorch/tensor/utils.py post_all_gather_processing: a Float8Tensor's transpose,
        a blockwise tensor's column-wise storage). torchao's Float8Linear under FSDP2
        (enable_fsdp_float8_all_gather, torchtitan docs/float8.md) casts the 16-bit shard
        to float8 before the gather: the same bytes. Embeddings, norms, biases and the
        output layer stay 16-bit (not TE FP8 GEMMs), as do gradients and their
        reductions. Refused: MXFP8 (both copies are cast from the fp32 master and what
        the gather moves depends on --reuse-grad-buf-for-mxfp8-param-ag: not modelled)
        and MoE models (the experts' gathers over edp: not modelled). The layout rule:
        fp8.check_fp8_param_gather."""
        if not isinstance(self.fp8_param_gather, bool):
            raise ConfigError(f"fp8_param_gather must be a bool, got {self.fp8_param_gather!r}")
        if self.fp8_param_gather and self.dtype != "fp8":
            raise ConfigError(f"fp8_param_gather=True (--fp8-param-gather) needs dtype 'fp8' "
                              f"(--dtype fp8), got {self.dtype!r}")
        if self.dtype != "fp8":
            for name in ("fp8_format", "fp8_recipe"):
                value = getattr(self, name)
                if value is not None:
                    raise ConfigError(f"{name}={value!r} (--{name.replace('_', '-')}) needs "
                                      f"dtype 'fp8' (--dtype fp8), got {self.dtype!r}")
            return
        if self.fp8_recipe is None:
            object.__setattr__(self, "fp8_recipe", DEFAULT_FP8_RECIPE)
        if self.fp8_recipe not in FP8_RECIPES:
            raise ConfigError(f"fp8_recipe={self.fp8_recipe!r} (--fp8-recipe) must be one of "
                              f"{', '.join(FP8_RECIPES)}")
        if self.fp8_format is None:
            object.__setattr__(self, "fp8_format", self.fp8.default_format)
        if self.fp8_format not in FP8_FORMATS:
            raise ConfigError(f"fp8_format={self.fp8_format!r} (--fp8-format) must be one of "
                              f"{', '.join(FP8_FORMATS)}")
        if self.fp8_param_gather and self.fp8_recipe == "mxfp8":
            raise ConfigError(f"fp8_param_gather=True (--fp8-param-gather) with fp8_recipe="
                              f"{self.fp8_recipe!r} is not modelled: choose delayed, "
                              f"tensorwise or blockwise")
        if self.fp8_param_gather and self.is_moe:
            raise ConfigError("fp8_param_gather=True (--fp8-param-gather) with num_experts set "
                              "is not modelled: the experts' gathers over edp are not")

    # --- shapes ------------------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def fp8(self) -> Fp8Recipe | None:
        """The FP8 recipe under dtype 'fp8', else None."""
        return FP8_RECIPES[self.fp8_recipe] if self.dtype == "fp8" else None

    @property
    def gemm_input_bytes(self) -> float:
        """Bytes per element of a TE linear layer's GEMM input: its FP8 copy under fp8
        (Fp8Recipe.copy_bytes), else as stored (DTYPE_BYTES' docstring)."""
        return self.fp8.copy_bytes if self.fp8 else self.dtype_bytes

    @property
    def gathered_gradient_bytes(self) -> float:
        """Bytes per element of a TE layer's output gradient in its sequence-parallel
        all-gather (Fp8Recipe.gathered_gradient_bytes; 16-bit without FP8)."""
        return self.fp8.gathered_gradient_bytes if self.fp8 else self.dtype_bytes

    @property
    def kv_hidden_size(self) -> int:
        """h_kv: width of K (and of V) = num_query_groups * head dim."""
        return self.num_query_groups * self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.moe_first_dense_layers if self.is_moe else 0

    def is_moe_layer(self, layer: int | None = None) -> bool:
        """Whether layer `layer` (0-based; None: the repeating layer) routes to experts."""
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)
                                  or not 0 <= layer < self.num_layers):
            raise ConfigError(f"layer={layer!r} must be an integer in [0, num_layers="
                              f"{self.num_layers})")
        return self.is_moe and (layer is None or layer >= self.moe_first_dense_layers)

    def _layer_kinds(self) -> tuple[tuple[int, int], ...]:
        """(how many layers, index of one of them) per kind of layer: dense, then MoE."""
        dense = self.num_layers - self.num_moe_layers
        kinds = ((dense, 0), (self.num_moe_layers, dense))
        return tuple(kind for kind in kinds if kind[0])

    def _sum_layers(self, per_layer) -> int | float:
        """Sum of per_layer(layer index) over all layers (one call per kind of layer)."""
        return sum(count * per_layer(index) for count, index in self._layer_kinds())

    @property
    def _mlp_matrices(self) -> int:
        return 3 if self.swiglu else 2  # SwiGLU: gate, up, down

    def _mlp_widths(self, layer: int | None) -> int:
        """Total ffn width one token runs through in `layer`: f dense, or k*f_e + f_sh."""
        if not self.is_moe_layer(layer):
            return self.ffn_hidden_size
        return (self.moe_router_topk * self.moe_ffn_hidden_size
                + (self.moe_shared_expert_intermediate_size or 0))

    # --- FLOPs (one micro-batch) -------------------------------------------------------
    def attention_core_flops(self) -> int:
        """4bs^2h: QK^T and attention-over-V (SC21); what selective recompute redoes."""
        b, s, h = self.micro_batch_size, self.seq_length, self.hidden_size
        return 4 * b * s * s * h

    @property
    def lora(self) -> bool:
        """Whether only LoRA adapters train (schedules.lora), the base weights frozen."""
        return self.lora_rank is not None

    def _weight_gemm_flops(self, layer: int | None) -> int:
        """Forward FLOPs of a layer's GEMMs with (base) weights: QKV 2bsh(h+2h_kv), out
        proj 2bsh^2, MLP 2bshf*(3 if swiglu else 2), an MoE layer's router 2bshE."""
        b, s, h = self.micro_batch_size, self.seq_length, self.hidden_size
        attention = 2 * b * s * h * (h + 2 * self.kv_hidden_size) + 2 * b * s * h * h
        mlp = 2 * b * s * h * self._mlp_widths(layer) * self._mlp_matrices
        if self.is_moe_layer(layer):
            mlp += 2 * b * s * h * self.num_experts
        return attention + mlp

    def lora_forward_flops(self) -> int:
        """A layer's adapters' forward, x A then (xA) B: 2bs r(in + out) per adapter."""
        return 2 * self.micro_batch_size * self.seq_length * adapter_param_count(self)

    def layer_forward_flops(self, layer: int | None = None) -> int:
        """Forward FLOPs of one layer: QKV 2bsh(h+2h_kv) + core attention 4bs^2h +
        out proj 2bsh^2 + MLP 2bshf*(3 if swiglu else 2). For f=4h, MHA, GELU this is
        SC21's 24bsh^2 + 4bs^2h. An MoE layer's MLP runs top-k experts and the shared
        experts per token, f -> k*f_e + f_sh, plus the router 2bshE. LoRA adds its
        adapters' GEMMs (lora_forward_flops)."""
        return (self._weight_gemm_flops(layer) + self.attention_core_flops()
                + self.lora_forward_flops())

    def skipped_weight_gradient_flops(self, layer: int | None = None) -> int:
        """FLOPs of the weight-gradient GEMMs a layer's backward does not run: under LoRA
        those of its frozen base weights (their forward's), else none."""
        return self._weight_gemm_flops(layer) if self.lora else 0

    def layer_backward_flops(self, layer: int | None = None) -> int:
        """Twice the forward: input and weight gradients, one GEMM each (SC21); under LoRA
        less the frozen base weights' weight gradients (skipped_weight_gradient_flops):
        their GEMMs run 1x (dX only), core attention and adapters 2x."""
        return 2 * self.layer_forward_flops(layer) - self.skipped_weight_gradient_flops(layer)

    def logits_forward_flops(self) -> int:
        """Output projection 2bshV (SC21)."""
        return 2 * self.micro_batch_size * self.seq_length * self.hidden_size * self.vocab_size

    @property
    def logits_backward_passes(self) -> int:
        """The output layer's backward FLOPs / its forward's: 2 (SC21), 1 when frozen
        under LoRA (the input gradient only)."""
        return 1 if self.lora else 2

    def forward_flops(self) -> int:
        """Forward FLOPs of one micro-batch through the whole model (layers + logits)."""
        return self._sum_layers(self.layer_forward_flops) + self.logits_forward_flops()

    def iteration_flops(self, num_microbatches: int, recompute: bool = False) -> int:
        """Model FLOPs of one iteration of B = micro_batch_size * num_microbatches
        sequences: layers 3x forward (4x with full recompute), logits 3x forward. For GPT
        this is SC21 eq. (3), 96Bslh^2(1 + s/6h + V/16lh) with recompute, and
        72Bslh^2(1 + s/6h + V/12lh) without. Under LoRA the GEMMs executed: forward and
        backward as layer_backward_flops and logits_backward_passes say."""
        require_positive_int("num_microbatches", num_microbatches)
        redo = 1 if recompute else 0
        per_mb = (self._sum_layers(lambda layer: (1 + redo) * self.layer_forward_flops(layer)
                                   + self.layer_backward_flops(layer))
                  + (1 + self.logits_backward_passes) * self.logits_forward_flops())
        return num_microbatches * per_mb

    # --- activations (bytes, one micro-batch, one layer) -------------------------------
    def layer_activation_bytes(self, tp: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none", layer: int | None = None) -> float:
        """Bytes one layer keeps for its backward, per micro-batch, on one TP rank.

        K22 section 4 itemised, per token (x sb), generalised to f, GQA and SwiGLU:
        - not split by TP (split by SP): two norm inputs 2h, QKV input h, fc1 input h
          (elements), and two dropout masks 2h (1 byte each) = K22's 10sbh;
        - split by TP: Q h, K h_kv, V h_kv, out-proj input h; MLP activation input f and
          fc2 input f (GELU) or gate f, up f, fc2 input f (SwiGLU) = K22's 24sbh/t;
        - split by TP: softmax output as, its dropout mask as (1 byte), dropout output
          as = K22's 5as^2b/t; gone with use_flash_attn (its O(sbh) stats are ignored)
          and with selective recompute.
        Tensor elements take dtype_bytes, masks 1 byte, so bf16/fp16 with f=4h, MHA and
        GELU reproduce K22 Table 2 exactly. Full recompute keeps the layer input only,
        2sbh (sbh*dtype_bytes), divided by t under SP (the input is sequence-sharded).
        An MoE layer's MLP terms use k*f_e + f_sh for f (each token's copies in the
        experts it runs); router logits and dispatch buffers are not counted.
        FP8 (dtype 'fp8'): a TE linear layer saves its GEMM input as one FP8 copy
        (Fp8Recipe.copy_bytes) instead of 16 bits (module/linear.py, layernorm_linear.py:
        the column-wise copy, or with SP the row-wise shard, `update_usage`): the QKV and
        fc1 inputs (an MoE layer's fc1 input stays 16-bit: the router, a 16-bit GEMM,
        keeps it; the experts' dispatched copies are not counted, as above), the out-proj
        input and the fc2 input; with flash attention the attention output stays too, in
        16 bit, for the flash backward.
        LoRA (Hu et al. 2021): a frozen base weight's input gradient dX = dY W^T needs W
        alone, so a GEMM input stays only where an adapter reads it, for dA = X^T (dY B^T)
        (_kept_gemm_inputs; with flash attention the out-proj input stays for the flash
        backward anyway), and each adapter keeps its rank-r intermediate XA for
        dB = (XA)^T dY: r elements per token on every TP rank (NeMo's adapters gather or
        all-reduce it; an approximation under SP, which would split a row-parallel
        layer's), not divided by tp.
        """
        require_positive_int("tp", tp)
        if recompute not in RECOMPUTE:
            raise ConfigError(f"recompute={recompute!r} must be one of {', '.join(RECOMPUTE)}")
        b, s, h = self.micro_batch_size, self.seq_length, self.hidden_size
        a, d, sb = self.num_attention_heads, self.dtype_bytes, s * b
        sp_div = tp if sequence_parallel else 1
        if recompute == "full":
            return sb * h * d / sp_div
        te_input = self.gemm_input_bytes  # a TE GEMM input kept for the backward
        fc1_input = d if self.is_moe_layer(layer) else te_input
        kept = self._kept_gemm_inputs()
        replicated = sb * (2 * h * d + h * (te_input * kept["linear_qkv"]
                                            + fc1_input * kept["linear_fc1"]) + 2 * h)
        width = self._mlp_widths(layer)
        flash_output = h if (self.fp8 or not kept["linear_proj"]) and self.use_flash_attn else 0
        sharded = sb * (d * (h + 2 * self.kv_hidden_size + flash_output
                             + (self._mlp_matrices - 1) * width)
                        + te_input * (h * kept["linear_proj"] + width * kept["linear_fc2"]))
        if recompute == "none" and not self.use_flash_attn:
            sharded += a * s * sb * (2 * d + 1)
        intermediates = sb * d * (self.lora_rank or 0) * len(adapters(self))
        return replicated / sp_div + sharded / tp + intermediates

    def _kept_gemm_inputs(self) -> dict[str, int]:
        """1 where a layer's weight GEMM (by Megatron name) keeps its input for the
        backward, else 0: every one, but under LoRA only those an adapter reads
        (layer_activation_bytes)."""
        adapted = {base for _, base, _, _ in adapters(self)}
        return {name: int(not self.lora or name in adapted) for name in NEMO_TARGETS}

    # --- parameters ----------------------------------------------------------------------
    def _attention_param_parts(self) -> tuple[int, int]:
        """(TP-sharded, TP-replicated) parameters of a layer outside its MLP: QKV and out
        proj weights and the QKV bias are sharded (column/row parallel); the out-proj bias
        and both norms are replicated."""
        h, hkv, bias = self.hidden_size, self.kv_hidden_size, self.add_bias_linear
        sharded = self._attention_weights() + (h + 2 * hkv if bias else 0)
        norms = 2 * (2 * h if self.normalization == "LayerNorm" else h)
        return sharded, norms + (h if bias else 0)

    def _attention_weights(self) -> int:
        """QKV h(h + 2h_kv) and out-proj h^2 weight matrices."""
        h = self.hidden_size
        return h * (h + 2 * self.kv_hidden_size) + h * h

    def _mlp_weights(self, f: int) -> int:
        """Weight matrices of one h -> f -> h MLP."""
        return self._mlp_matrices * self.hidden_size * f

    def _mlp_param_parts(self, f: int) -> tuple[int, int]:
        """(TP-sharded, TP-replicated) parameters of one h -> f -> h MLP: weights and the
        fc1 bias are sharded, the fc2 (row-parallel) bias is replicated."""
        h, bias = self.hidden_size, self.add_bias_linear
        fc1_bias = (2 * f if self.swiglu else f) if bias else 0
        return self._mlp_weights(f) + fc1_bias, (h if bias else 0)

    def layer_fp8_weight_count(self, tp: int = 1, ep: int = 1, layer: int | None = None,
                               etp: int | None = None) -> float:
        """Weights of a layer's FP8 GEMMs (layer_kernels.FP8_GEMMS) on one rank, of which
        TE keeps FP8 copies: QKV, out proj and MLP matrices, or an MoE layer's shared
        experts' and its E/ep routed experts' (split over etp, None: tp) matrices; no
        bias, norm or router."""
        if not self.is_moe_layer(layer):
            return (self._attention_weights() + self._mlp_weights(self.ffn_hidden_size)) / tp
        shared = self._mlp_weights(self.moe_shared_expert_intermediate_size or 0)
        routed = self._mlp_weights(self.moe_ffn_hidden_size) / (tp if etp is None else etp)
        return (self._attention_weights() + shared) / tp + self.num_experts / ep * routed

    def layer_param_count(self, tp: int = 1, ep: int = 1, layer: int | None = None,
                          etp: int | None = None) -> int | float:
        """Parameters of one layer on one rank: QKV h(h+2h_kv) + out proj h^2 +
        MLP (3 if swiglu else 2)hf + biases + norms (2*2h LayerNorm, 2h RMSNorm); for GPT
        SC21's 12h^2 + 13h. An MoE layer holds E experts of width f_e (each of ep ranks
        num_experts/ep of them), the shared experts f_sh (on every EP rank) and the router
        hE (replicated). Sharded parts divide by tp, the routed experts' by the expert
        tensor-parallel degree `etp` (Megatron-Core's --expert-tensor-parallel-size;
        None: tp): E/ep * (expert/etp + its replicated fc2 bias). An int when
        tp = ep = etp = 1."""
        attention, replicated = self._attention_param_parts()
        if not self.is_moe_layer(layer):
            mlp, mlp_replicated = self._mlp_param_parts(self.ffn_hidden_size)
            if tp == 1:
                return attention + replicated + mlp + mlp_replicated
            return attention / tp + replicated + mlp / tp + mlp_replicated
        shared, shared_replicated = (self._mlp_param_parts(self.moe_shared_expert_intermediate_size)
                                     if self.moe_shared_expert_intermediate_size else (0, 0))
        replicated += self.hidden_size * self.num_experts + shared_replicated
        routed = self.layer_expert_param_count(tp, ep, layer, etp)
        if tp == 1 and ep == 1 and (etp is None or etp == 1):
            return attention + replicated + shared + routed
        return (attention + shared) / tp + replicated + routed

    def layer_adapter_param_count(self, tp: int = 1) -> float:
        """A layer's LoRA adapter parameters on one rank (schedules.lora): r(in + out)
        per adapted matrix, A and B split over tp as their base layer is (NeMo's
        ParallelLinearAdapter); 0 without LoRA."""
        return adapter_param_count(self) / tp

    def layer_frozen_weight_bytes(self, tp: int = 1) -> float:
        """Bytes of a layer's frozen base on one rank under LoRA: its parameters
        (layer_param_count) in dtype_bytes, but its linear weights as QLoRA stores them
        (schedules.lora.base_weight_bytes)."""
        linear = self._attention_weights() + self._mlp_weights(self.ffn_hidden_size)
        return (self.dtype_bytes * (self.layer_param_count(tp) - linear / tp)
                + base_weight_bytes(self, self.dtype_bytes) / tp)

    def layer_expert_param_count(self, tp: int = 1, ep: int = 1, layer: int | None = None,
                                 etp: int | None = None) -> int | float:
        """The routed experts' part of layer_param_count on one rank: E/ep experts, each
        split over `etp` ranks (None: tp) but for its replicated fc2 bias; 0 for a dense
        layer. Megatron-Core reduces their gradients over the expert data-parallel group,
        not the dense one (schedules.data_parallel)."""
        if not self.is_moe_layer(layer):
            return 0
        expert, expert_replicated = self._mlp_param_parts(self.moe_ffn_hidden_size)
        etp = tp if etp is None else etp
        if ep == 1 and etp == 1:
            return self.num_experts * (expert + expert_replicated)
        return self.num_experts / ep * (expert / etp + expert_replicated)

    def embedding_param_count(self) -> int:
        """Word embedding Vh, plus position embedding sh when learned_absolute. Vocab
        padding (Megatron pads V to a multiple of 128*tp) is not modelled."""
        pos = self.seq_length if self.position_embedding_type == "learned_absolute" else 0
        return (self.vocab_size + pos) * self.hidden_size

    def output_param_count(self) -> int:
        """Output projection Vh when untied from the embedding, else 0 (shared)."""
        return self.vocab_size * self.hidden_size if self.untie_embeddings_and_output_weights else 0

    def final_norm_param_count(self) -> int:
        return 2 * self.hidden_size if self.normalization == "LayerNorm" else self.hidden_size

    def param_count(self) -> int:
        """Total parameters, every expert counted (SC21 eq. (2) for GPT, plus the final
        norm's 2h)."""
        return int(self._sum_layers(lambda layer: self.layer_param_count(layer=layer))
                   + self.embedding_param_count() + self.output_param_count()
                   + self.final_norm_param_count())

    def active_param_count(self) -> int:
        """Parameters one token runs through: param_count less the E - k routed experts
        it skips in each MoE layer (embedding and output layer included). Equals
        param_count for a dense model."""
        if not self.is_moe:
            return self.param_count()
        expert, expert_replicated = self._mlp_param_parts(self.moe_ffn_hidden_size)
        skipped = (self.num_experts - self.moe_router_topk) * (expert + expert_replicated)
        return self.param_count() - self.num_moe_layers * skipped
