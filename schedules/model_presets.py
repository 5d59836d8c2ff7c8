"""Model presets: published shapes by name (GPT-3, Llama 2, Llama 3, the Megatron-LM SC21 Table 1
configurations, Korthikanti et al.'s 22B, Mixtral 8x7B, a DeepSeek-V3-like MoE), and
`get_model` to look one up with Megatron-named fields overridden. Sources per preset below.
"""
from __future__ import annotations

from dataclasses import fields, replace

from .errors import ConfigError
from .model import ModelSpec, default_ffn_hidden_size

# --- presets ---------------------------------------------------------------------------
# Each preset's shape is the published one; where a field is our choice (sequence length of
# a long-context model, how an unsupported part is approximated) the comment says so.
# micro_batch_size stays 1: it belongs to a run, not to the model (see
# benchmarks/fidelity_data.py for the published runs' micro-batch sizes).

# GPT (SC21 section 5.1): GELU MLP of 4h, LayerNorm, biases, learned positions, embedding
# tied to the output layer, vocabulary 51,200, sequence 2048.
_GPT = dict(seq_length=2048, vocab_size=51200)

# Llama 3 (Llama Team, "The Llama 3 Herd of Models", 2024, Table 3; Hugging Face
# config.json of meta-llama/Llama-3.1-*): SwiGLU, RMSNorm, no biases, RoPE, untied output
# layer, GQA with 8 KV heads, vocabulary 128,256 (config.json; the paper's table rounds
# it to 128K), pre-training sequence 8192.
_LLAMA3 = dict(swiglu=True, normalization="RMSNorm", add_bias_linear=False,
               position_embedding_type="rope", untie_embeddings_and_output_weights=True,
               use_flash_attn=True, vocab_size=128256, seq_length=8192)

# Llama 2 (Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models",
# Table 1; Hugging Face meta-llama/Llama-2-*-hf config.json): Llama 3's layer kinds
# (SwiGLU, RMSNorm, no biases, RoPE, untied output layer) with a 32,000-token vocabulary
# and a 4096-token context; multi-head attention at 7B and 13B, 8 KV heads at 70B.
_LLAMA2 = {**_LLAMA3, "vocab_size": 32000, "seq_length": 4096}

# SC21 Table 1 (weak scaling, 1.7B .. 1T): (name, layers, hidden, heads); parameters by
# eq. (2) round to the table's 1.7, 3.6, 7.5, 18.4, 39.1, 76.1, 145.6, 310.1, 529.6, 1008.0
# billion. sc21-529.6b and sc21-1t are also Korthikanti et al. 2022's 530B and 1T.
_SC21_TABLE_1 = (("sc21-1.7b", 24, 2304, 24), ("sc21-3.6b", 30, 3072, 32),
                 ("sc21-7.5b", 36, 4096, 32), ("sc21-18.4b", 40, 6144, 48),
                 ("sc21-39.1b", 48, 8192, 64), ("sc21-76.1b", 60, 10240, 80),
                 ("sc21-145.6b", 80, 12288, 96), ("sc21-310.1b", 96, 16384, 128),
                 ("sc21-529.6b", 105, 20480, 128), ("sc21-1t", 128, 25600, 160))

MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m for m in (
        ModelSpec(24, 2048, 16, 2048, 50257, name="gpt3-1.3b"),
        # GPT-3 175B (Brown et al. 2020, Table 2.1); SC21 counts 174.6B parameters.
        ModelSpec(96, 12288, 96, name="gpt3-175b", **_GPT),
        *(ModelSpec(layers, hidden, heads, name=name, **_GPT)
          for name, layers, hidden, heads in _SC21_TABLE_1),
        # Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
        # Models"), Table 3's 22B: 48 layers, hidden 6144, 64 heads (22.07B parameters).
        ModelSpec(48, 6144, 64, name="k22-22b", **_GPT),
        ModelSpec(num_layers=32, hidden_size=4096, ffn_hidden_size=11008, num_attention_heads=32,
                  name="llama2-7b", **_LLAMA2),
        ModelSpec(num_layers=40, hidden_size=5120, ffn_hidden_size=13824, num_attention_heads=40,
                  name="llama2-13b", **_LLAMA2),
        ModelSpec(num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                  num_query_groups=8, name="llama2-70b", **_LLAMA2),
        ModelSpec(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                  num_query_groups=8, name="llama3-8b", **_LLAMA3),
        ModelSpec(num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                  num_query_groups=8, name="llama3-70b", **_LLAMA3),
        ModelSpec(num_layers=126, hidden_size=16384, ffn_hidden_size=53248,
                  num_attention_heads=128, num_query_groups=8, name="llama3-405b", **_LLAMA3),
        # Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1; Hugging Face
        # mistralai/Mixtral-8x7B-v0.1 config.json): Mistral-7B layers whose MLP is 8 SwiGLU
        # experts of 14336, top-2; 46.7B parameters, 12.9B active. Trained with a 32K context;
        # the preset uses 4096, the sequence of Megatron-LM's Mixtral 8x7B training example
        # (examples/mixtral/train_mixtral_8x7B_slurm.sh): pass seq_length=32768 for 32K.
        ModelSpec(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                  num_query_groups=8, num_experts=8, moe_router_topk=2, name="mixtral-8x7b",
                  **{**_LLAMA3, "vocab_size": 32000, "seq_length": 4096}),
        # DeepSeek-V3-like (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", section 4.2;
        # Hugging Face deepseek-ai/DeepSeek-V3 config.json): 61 layers, hidden 7168, the
        # first 3 dense (SwiGLU 18432), the other 58 MoE with 256 routed experts of 2048
        # (top-8) and 1 shared expert of 2048, vocabulary 129,280, untied output layer,
        # pre-training sequence 4096. 671B parameters, 37B active (the paper's).
        # NOT modelled: Multi-head Latent Attention is approximated by plain multi-head
        # attention with 128 heads of 7168/128 = 56 (the real heads are 192 wide for Q/K
        # and 128 for V, behind low-rank Q (1536) and KV (512) projections), so attention
        # holds 4h^2 = 205.5M parameters per layer instead of MLA's ~187.1M, and core
        # attention FLOPs are 4bs^2h instead of MLA's 2bs^2 * 128 * (192 + 128), 2.9x
        # more; activations are those of that MHA. Also not modelled: the multi-token
        # prediction module (11.5B more unique parameters, not part of the 671B), FP8 GEMMs
        # (dtype stays bf16), node-limited routing and the router's bias terms. Parameters
        # come out 1.1B high: 672.1B total (+0.17%), 38.7B active with both embeddings.
        ModelSpec(num_layers=61, hidden_size=7168, ffn_hidden_size=18432,
                  num_attention_heads=128, num_experts=256, moe_router_topk=8,
                  moe_ffn_hidden_size=2048, moe_shared_expert_intermediate_size=2048,
                  moe_first_dense_layers=3, name="deepseek-v3-like",
                  **{**_LLAMA3, "vocab_size": 129280, "seq_length": 4096}),
    )
}


MODEL_ALIASES = {"llama3.1-8b": "llama3-8b", "llama3.1-70b": "llama3-70b",
                 "llama3.1-405b": "llama3-405b", "llama3.3-70b": "llama3-70b"}
"""Names of later releases with the same shape: Llama 3.1 and 3.3 keep Llama 3's layers
(Llama Team 2024, section 3; Hugging Face config.json); only their longer context (RoPE
scaling to 128K) differs, which no preset field holds."""


def get_model(name: str, **overrides: object) -> ModelSpec:
    """A preset by name or alias (case-insensitive), with Megatron-named fields
    overridden."""
    key = name.strip().lower()
    key = MODEL_ALIASES.get(key, key)
    if key not in MODEL_PRESETS:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(MODEL_PRESETS)}")
    known = {f.name for f in fields(ModelSpec)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"unknown model field(s) {', '.join(unknown)}: known fields are "
                          f"{', '.join(sorted(known))}")
    preset = MODEL_PRESETS[key]
    # a field the preset derives from another (by Megatron's defaults) follows an override
    # of its source, unless given: hidden_size or swiglu re-derive the ffn
    ffn = default_ffn_hidden_size(preset.hidden_size, preset.swiglu)
    for field, sources, derived in (
            ("ffn_hidden_size", ("hidden_size", "swiglu"), ffn),
            ("num_query_groups", ("num_attention_heads",), preset.num_attention_heads),
            ("moe_ffn_hidden_size", ("ffn_hidden_size", "hidden_size", "swiglu"),
             preset.ffn_hidden_size)):
        if (any(s in overrides for s in sources) and field not in overrides
                and getattr(preset, field) == derived):
            overrides[field] = None
    return replace(preset, **overrides)
