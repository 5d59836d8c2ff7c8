"""ModelSpec: a decoder-only transformer's shape, the single source of its FLOPs, bytes and
parameter counts. Field names follow Megatron-LM's flags. Units: FLOPs (multiply-add = 2),
bytes, parameters (counts).

Sources:
- FLOPs: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  using Megatron-LM", SC21 (hereafter SC21), section 5.1 and appendix: a layer's forward
  is 24bsh^2 + 4bs^2h, backward twice the forward, logits 2bshV; eq. (3).
- Parameters: SC21 eq. (1), 12lh^2(1 + 13/(12h) + (V+s)/(12lh)).
- Activations: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", 2022 (hereafter K22), section 4 and Table 2.
Notation: b micro-batch, s sequence, h hidden, f ffn hidden, a heads, V vocab,
h_kv = num_query_groups * h / a (K and V width under grouped-query attention).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .errors import ConfigError, require_positive_int

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")
RECOMPUTE = ("none", "selective", "full")
DEFAULT_MOE_TOPK = 2  # Megatron-LM's --moe-router-topk default


@dataclass(frozen=True)
class ModelSpec:
    """A GPT/Llama-style decoder. `ffn_hidden_size` defaults to 4*hidden_size and
    `num_query_groups` to num_attention_heads (multi-head attention); both are filled in
    by __post_init__, so equal shapes compare equal (`get_model` re-derives them when their
    source is overridden; `dataclasses.replace` does not). MoE: `num_experts` experts per layer,
    each token routed to `moe_router_topk` of them (default 2, as in Megatron-LM)."""

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
    num_experts: int | None = None
    moe_router_topk: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if self.num_query_groups is None:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                     "vocab_size", "ffn_hidden_size", "num_query_groups", "micro_batch_size"):
            require_positive_int(name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size={self.hidden_size} must be divisible by "
                              f"num_attention_heads={self.num_attention_heads}")
        if self.num_attention_heads % self.num_query_groups:
            raise ConfigError(f"num_attention_heads={self.num_attention_heads} must be divisible "
                              f"by num_query_groups={self.num_query_groups}")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"dtype={self.dtype!r} is unknown: choose one of "
                              f"{', '.join(DTYPE_BYTES)}")
        if self.normalization not in NORMALIZATIONS:
            raise ConfigError(f"normalization={self.normalization!r} must be one of "
                              f"{', '.join(NORMALIZATIONS)}")
        if self.position_embedding_type not in POSITION_EMBEDDINGS:
            raise ConfigError(f"position_embedding_type={self.position_embedding_type!r} must "
                              f"be one of {', '.join(POSITION_EMBEDDINGS)}")
        for name in ("swiglu", "add_bias_linear", "untie_embeddings_and_output_weights",
                     "use_flash_attn"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.num_experts is None:
            if self.moe_router_topk is not None:
                raise ConfigError("moe_router_topk is set but num_experts is not: set both "
                                  "for a mixture-of-experts model")
        else:
            require_positive_int("num_experts", self.num_experts)
            if self.moe_router_topk is None:
                object.__setattr__(self, "moe_router_topk",
                                   min(DEFAULT_MOE_TOPK, self.num_experts))
            require_positive_int("moe_router_topk", self.moe_router_topk)
            if self.moe_router_topk > self.num_experts:
                raise ConfigError(f"moe_router_topk={self.moe_router_topk} must be <= "
                                  f"num_experts={self.num_experts}")

    # --- shapes ------------------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_hidden_size(self) -> int:
        """h_kv: width of K (and of V) = num_query_groups * head dim."""
        return self.num_query_groups * self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def _mlp_matrices(self) -> int:
        return 3 if self.swiglu else 2  # SwiGLU: gate, up, down

    # --- FLOPs (one micro-batch) -------------------------------------------------------
    def attention_core_flops(self) -> int:
        """4bs^2h: QK^T and attention-over-V (SC21); what selective recompute redoes."""
        b, s, h = self.micro_batch_size, self.seq_length, self.hidden_size
        return 4 * b * s * s * h

    def layer_forward_flops(self) -> int:
        """Forward FLOPs of one layer: QKV 2bsh(h+2h_kv) + core attention 4bs^2h +
        out proj 2bsh^2 + MLP 2bshf*(3 if swiglu else 2). For f=4h, MHA, GELU this is
        SC21's 24bsh^2 + 4bs^2h. MoE: the MLP runs for top-k experts per token, plus the
        router 2bshE."""
        b, s, h, f = self.micro_batch_size, self.seq_length, self.hidden_size, self.ffn_hidden_size
        attention = (2 * b * s * h * (h + 2 * self.kv_hidden_size)
                     + self.attention_core_flops() + 2 * b * s * h * h)
        mlp = 2 * b * s * h * f * self._mlp_matrices
        if self.is_moe:
            mlp = mlp * self.moe_router_topk + 2 * b * s * h * self.num_experts
        return attention + mlp

    def layer_backward_flops(self) -> int:
        """Twice the forward: input and weight gradients, one GEMM each (SC21)."""
        return 2 * self.layer_forward_flops()

    def logits_forward_flops(self) -> int:
        """Output projection 2bshV (SC21)."""
        return 2 * self.micro_batch_size * self.seq_length * self.hidden_size * self.vocab_size

    def forward_flops(self) -> int:
        """Forward FLOPs of one micro-batch through the whole model (layers + logits)."""
        return self.num_layers * self.layer_forward_flops() + self.logits_forward_flops()

    def iteration_flops(self, num_microbatches: int, recompute: bool = False) -> int:
        """Model FLOPs of one iteration of B = micro_batch_size * num_microbatches
        sequences: layers 3x forward (4x with full recompute), logits 3x forward. For GPT
        this is SC21 eq. (3), 96Bslh^2(1 + s/6h + V/16lh) with recompute, and
        72Bslh^2(1 + s/6h + V/12lh) without."""
        require_positive_int("num_microbatches", num_microbatches)
        passes = 4 if recompute else 3
        per_mb = passes * self.num_layers * self.layer_forward_flops() \
            + 3 * self.logits_forward_flops()
        return num_microbatches * per_mb

    # --- activations (bytes, one micro-batch, one layer) -------------------------------
    def layer_activation_bytes(self, tp: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none") -> float:
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
        """
        require_positive_int("tp", tp)
        if recompute not in RECOMPUTE:
            raise ConfigError(f"recompute={recompute!r} must be one of {', '.join(RECOMPUTE)}")
        b, s, h, f = self.micro_batch_size, self.seq_length, self.hidden_size, self.ffn_hidden_size
        a, d, sb = self.num_attention_heads, self.dtype_bytes, s * b
        sp_div = tp if sequence_parallel else 1
        if recompute == "full":
            return sb * h * d / sp_div
        replicated = sb * (4 * h * d + 2 * h)
        mlp = (3 if self.swiglu else 2) * f * (self.moe_router_topk if self.is_moe else 1)
        sharded = sb * d * (2 * h + 2 * self.kv_hidden_size + mlp)
        if recompute == "none" and not self.use_flash_attn:
            sharded += a * s * sb * (2 * d + 1)
        return replicated / sp_div + sharded / tp

    # --- parameters ----------------------------------------------------------------------
    def _layer_param_parts(self) -> tuple[int, int, int, int]:
        """(attention TP-sharded, TP-replicated, per-expert MLP TP-sharded, per-expert MLP
        TP-replicated) parameters of one layer. Megatron column-parallel weights and biases
        are sharded; row-parallel biases (out proj, fc2), norm weights and the router are
        replicated."""
        h, f, hkv, bias = self.hidden_size, self.ffn_hidden_size, self.kv_hidden_size, \
            self.add_bias_linear
        attention = h * (h + 2 * hkv) + h * h + (h + 2 * hkv if bias else 0)
        norms = 2 * (2 * h if self.normalization == "LayerNorm" else h)
        replicated = norms + (h if bias else 0) + (h * self.num_experts if self.is_moe else 0)
        fc1_bias = (2 * f if self.swiglu else f) if bias else 0
        mlp = self._mlp_matrices * h * f + fc1_bias
        return attention, replicated, mlp, (h if bias else 0)

    def layer_param_count(self, tp: int = 1, ep: int = 1) -> int | float:
        """Parameters of one layer on one rank: QKV h(h+2h_kv) + out proj h^2 +
        MLP (3 if swiglu else 2)hf + biases + norms (2*2h LayerNorm, 2h RMSNorm); for GPT
        SC21's 12h^2 + 13h. MoE: MLP x num_experts + router hE; each of ep ranks holds
        num_experts/ep experts. Sharded parts divide by tp (see _layer_param_parts).
        An int when tp = ep = 1."""
        attention, replicated, mlp, mlp_replicated = self._layer_param_parts()
        experts = self.num_experts or 1
        if tp == 1 and ep == 1:
            return attention + replicated + experts * (mlp + mlp_replicated)
        experts_here = experts / ep if self.is_moe else 1
        return attention / tp + replicated + experts_here * (mlp / tp + mlp_replicated)

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
        """Total parameters (SC21 eq. (1) for GPT)."""
        return int(self.num_layers * self.layer_param_count() + self.embedding_param_count()
                   + self.output_param_count() + self.final_norm_param_count())


_LLAMA3 = dict(swiglu=True, normalization="RMSNorm", add_bias_linear=False,
               position_embedding_type="rope", untie_embeddings_and_output_weights=True,
               use_flash_attn=True, vocab_size=128256, seq_length=8192)

MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m for m in (
        ModelSpec(24, 2048, 16, 2048, 50257, name="gpt3-1.3b"),
        ModelSpec(96, 12288, 96, 2048, 51200, name="gpt3-175b"),
        ModelSpec(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                  num_query_groups=8, name="llama3-8b", **_LLAMA3),
        ModelSpec(num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                  num_query_groups=8, name="llama3-70b", **_LLAMA3),
    )
}


def get_model(name: str, **overrides: object) -> ModelSpec:
    """A preset by name (case-insensitive), with Megatron-named fields overridden."""
    key = name.strip().lower()
    if key not in MODEL_PRESETS:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(MODEL_PRESETS)}")
    known = {f.name for f in fields(ModelSpec)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"unknown model field(s) {', '.join(unknown)}: known fields are "
                          f"{', '.join(sorted(known))}")
    preset = MODEL_PRESETS[key]
    # derived defaults follow their source: overriding hidden_size re-derives a 4h ffn
    for field, source, derived in (("ffn_hidden_size", "hidden_size", 4 * preset.hidden_size),
                                   ("num_query_groups", "num_attention_heads",
                                    preset.num_attention_heads)):
        if source in overrides and field not in overrides and getattr(preset, field) == derived:
            overrides[field] = None
    return replace(preset, **overrides)
