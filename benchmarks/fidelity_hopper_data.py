"""Published training throughput on Hopper and Blackwell GPUs (H100 SXM, H200, B200), with
the settings of each run, for benchmarks that check clustersim beyond the A100 papers of
benchmarks/fidelity_data.py: data with its sources, no simulation.

Units: seconds; TFLOP/s (1e12 FLOP/s) per GPU; tokens/s per GPU; percentages as printed
(43 means 43 %). A number typed here is the source's, verbatim; a field the source does not
give is None and the row's `notes` (or `assumed`) says what a simulation has to assume.

Sources (five organisations: NVIDIA, Meta's Llama team, the PyTorch team at Meta,
MosaicML/Databricks, Trainy)
- MLM: NVIDIA/Megatron-LM README.md, section "Training Speed and Scalability" (today
  "Performance Benchmarking" / "Weak Scaling Results"), its table image
  images/model_table.png; added by commit f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4
  ("New scaling figures on H100 GPUs", 2024-07-15), still at HEAD d98e8a64 (2026). The
  figures' legend names Megatron-Core r0.8.0. https://github.com/NVIDIA/Megatron-LM
  The text: GPT models 2B-462B, vocabulary 131,072, sequence 4096, up to 6144 H100 GPUs,
  --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap, pipeline overlap by
  default, end-to-end throughput including data loading, optimizer and logging. The table:
  size, heads, hidden, layers, TP, PP, DP, GPUs, batch, per-GPU TFLOP/s, MFU, aggregate
  PFLOP/s. The strong-scaling GPT-3 run (96 to 4608 GPUs, batch 1152, MFU 47 % -> 42 %) is
  a plot only, so it is not typed here.
- NEMO2407: NVIDIA/NeMo docs/source/performance/performance_summary.md at commit
  8e3d65dcfe ("24.07 perf numbers", 2024-09-09), published as "Performance Benchmarks",
  https://docs.nvidia.com/nemo-framework/user-guide/24.09/performance/performance_summary.html
  (the 24.12 page repeats it). Table "Pretraining": FP8, container NeMo 24.07, system
  DGX-H100; columns #-GPUs, GBS, MBS, sequence length, TP, PP, CP, VP, tokens/s/GPU, model
  TFLOP/s/GPU (and an estimated time to train, derived, not typed).
- NEMO2502: "Performance" page of the NeMo Framework user guide, container NeMo 25.02,
  https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance_summary.html
  as stored in early 2025 (later replaced by 25.04/25.07 tables, kept under .../archive/).
  Table "Pretraining", FP8 "(using NeMo 2.0)", system DGX-B200 (all rows typed) and the
  first row of its DGX-H100 table (the stored copy we could read stops after it); columns
  #-GPUs, GBS, MBS, sequence length, TP, PP, CP, VP, EP, GA, tokens/s/GPU, model TFLOP/s/GPU.
- LLAMA3: Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv:2407.21783 (v3,
  2024-11-23), section 3.3.2 and Table 4 ("Scaling configurations and MFU for each stage of
  Llama 3 405B pre-training"): GPUs, TP, CP, PP, DP, sequence length, batch size/DP,
  tokens/batch, TFLOPs/GPU, BF16 MFU. Section 3.3.1: H100 80GB HBM3 at 700 W, 8 per Grand
  Teton server on NVLink; the 405B trained on RoCE (Arista 7800 and Minipack2 switches,
  400 Gbps between GPUs, three-layer Clos of 24K GPUs, up to 16K used). Section 3.3.2: DP is
  FSDP (ZeRO-2-like: parameters not resharded after the forward), interleaved pipeline
  schedule with tunable micro-batches, all-gather-based CP.
- TITAN: pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (torchtitan
  9dec370 of 2024-12-26, torch 1963fc8, torchao eab345c), Tables 1-6, the torchtitan
  team's Llama 3.1 8B/70B/405B runs; also arXiv:2410.06511. Hardware (stated): Grand Teton,
  H100 with 96 GB HBM2e (2.4 TB/s) at the default 500 W power limit, NVLink inside a host,
  400 Gb/s RDMA per GPU between hosts. TPS/GPU read at iteration 90. Train configs and
  defaults from train_configs/llama3_{8b,70b,405b}.toml and torchtitan/config_manager.py at
  9dec370.
- TRAINY: pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md (Trainy
  on WhiteFiber, June 2025; torchtitan e7c0cae, torch 2.8.0a0+5228986c39): Llama 3.1 8B,
  8 H200 per host on NVLink, 400 Gb/s (ConnectX-7) RDMA per GPU, 4 and 8 hosts; the command
  line is printed; the rest from torchtitan/models/llama3/train_configs/llama3_8b.toml at
  e7c0cae. TPS/GPU sampled at iteration 100.
- MOSAIC: mosaicml/llm-foundry scripts/train/benchmarking/README.md, tables "H100 80GB
  BF16 (Large Scale, >= 128 GPUs)" and "H100 80GB FP8", added by commit 5e85bd62 (2024-01-06,
  "Shashank/new benchmarks (#838)"); model shapes from scripts/train/yamls/pretrain/
  mpt-*.yaml at that commit; MFU formula in the README and collect_results.py; peak from
  Composer's GPU_AVAILABLE_FLOPS['h100-sxm'] (amp_bf16 1.979e15/2, amp_fp8 3.958e15/2).

What each source's metric means, and how a time per iteration follows (`iteration_time_s`)
- tokens/s/GPU (NEMO*, TITAN, TRAINY, MOSAIC): global batch * sequence / (tokens/s/GPU *
  GPUs). torchtitan divides the tokens one data-parallel rank loads by time * TP*PP*CP,
  which is the same thing. MOSAIC prints the total tokens/s as well; we use it.
- TFLOP/s/GPU (MLM, LLAMA3): FLOPs of one iteration / (TFLOP/s * GPUs).
  MLM counts Megatron-LM's `num_floating_point_operations` (megatron/training/training.py at
  f2e5db40, `megatron_flops` here): 12*B*s*l*h^2*((1 + g/a + s/h) + (f/h)*k*(3/2 if SwiGLU)
  + V/(2lh)), no causal discount, no recompute. NeMo's "Model TFLOP/s/GPU" uses the same
  expression (nemo/utils/flops_formulas.py up to 2025-08, which then halved core attention;
  the tests check the printed ratios). MLM's MFU is that over 989 TFLOP/s: 989 is the only
  peak for which all nine printed MFUs round right (989.4 fails the 462B row).
  LLAMA3 cites PaLM (Chowdhery et al.) for MFU and gives no formula; `palm_flops_per_token`
  is PaLM appendix B's 6N + 12*l*h*s (N parameters, here ModelSpec's count including both
  embeddings: our choice); its "BF16 MFU" is over the H100's dense BF16 peak.
- MOSAIC MFU: (6*N*s + 12*l*h*s^2) * sequences/s / (GPUs * peak), N = the printed NumParams,
  peak 989.5 TFLOP/s (amp_bf16) or 1979 (amp_fp8); HFU multiplies by 4/3 when activation
  checkpointing is on. "Model TFLOP" is that per GPU, truncated to an integer.
- TITAN MFU (not reported in the tables; one sentence gives 33 % to 39 % for the 8B
  without Float8): (6N + 12*l*h*s) * TPS / 989e12 with N excluding the token embedding
  (torchtitan utils.get_num_flop_per_token and get_peak_flops at 9dec370).

Missing settings, and what a simulation must assume (per-row `assumed` says which apply)
- MLM: micro-batch size, virtual pipeline stages, sequence parallelism, recompute, dtype,
  ffn width, query groups, tied embeddings. The MFU over 989 implies BF16; the shapes behave
  as GPT with a 4h GeLU MLP and multi-head attention (what Megatron's defaults give), and
  "1.7B" and "7.1B" need untied embeddings. Assume Megatron defaults: MBS 1, no interleaving,
  SP on with TP>1 (required by --tp-comm-overlap), no recompute, distributed optimizer
  (required by --overlap-param-gather).
- NEMO2407 / NEMO2502: sequence parallelism, recompute, distributed optimizer, FP8 recipe
  and communication overlap are not in the tables. Assume the NeMo performance recipes'
  choices: SP on with TP>1, distributed optimizer, TP/DP/PP overlap on, no recompute.
  NEMO2407 has no GA or EP columns (GA follows: GBS / (MBS * DP)).
- LLAMA3: micro-batch size, number of micro-batches, virtual stages, recompute, FP8 (none:
  MFU is BF16). DP is FSDP.
- TITAN: sequence length is not in the tables (the toml files give 8192 for all three
  models); the pipeline micro-batch count is not printed (default: the PP degree, 8, so 4
  sequences per micro-batch for 405B); for Interleaved 1F1B the default split is 2 stages
  per rank (16 stages of 126 layers, uneven). torchtitan's TP shards the norms along the
  sequence (SequenceParallel), so `sequence_parallel` is True wherever TP > 1.
- TRAINY: FSDP over all GPUs (toml: data_parallel_shard_degree -1), selective per-op
  activation checkpointing (toml), torch.compile, Float8 tensorwise with FP8 FSDP
  all-gather.

Attention kernel (`attention_backend`, topologies.attention_kernels): MLM, NEMO and LLAMA3
'auto' (Megatron-Core with Transformer Engine: cuDNN fused attention on Hopper and
Blackwell); TITAN and TRAINY 'flash': torchtitan calls PyTorch's scaled_dot_product_attention
with the FLASH backend first and CUDNN first only on compute capability 10.0 (torchtitan
PR #1196), and the torch builds of both runs put FlashAttention-2 first on H100/H200
(cuDNN was first only in 2.5.0; PyTorch PR #138522); MOSAIC 'flash' (assumed, per row).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from clustersim.schedules.model import ModelSpec

# Dense peaks the sources divide by (TFLOP/s per GPU).
H100_BF16_PEAK_MLM = 989.0      # implied by all nine MLM rows (module docstring)
H100_BF16_PEAK_TITAN = 989.0    # torchtitan utils.get_peak_flops, "H100 SXM and others"
H100_BF16_PEAK_COMPOSER = 989.5  # Composer: 1.979e15 / 2
H100_FP8_PEAK_COMPOSER = 1979.0  # Composer: 3.958e15 / 2


@dataclass(frozen=True)
class Model:
    """A decoder's shape as the run used it. `preset` names the clustersim preset with the
    same shape (None: none). `config` cites where the shape comes from."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    swiglu: bool
    config: str
    num_experts: int | None = None
    moe_router_topk: int | None = None
    preset: str | None = None

    def spec(self, seq_length: int, micro_batch_size: int = 1) -> ModelSpec:
        """clustersim's ModelSpec of this shape (GPT-style unless SwiGLU)."""
        llama = dict(swiglu=True, normalization="RMSNorm", add_bias_linear=False,
                     position_embedding_type="rope",
                     untie_embeddings_and_output_weights=True) if self.swiglu else {}
        return ModelSpec(
            num_layers=self.num_layers, hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads, seq_length=seq_length,
            vocab_size=self.vocab_size, ffn_hidden_size=self.ffn_hidden_size,
            num_query_groups=self.num_query_groups, micro_batch_size=micro_batch_size,
            num_experts=self.num_experts, moe_router_topk=self.moe_router_topk,
            use_flash_attn=True, name=self.name, **llama)


@dataclass(frozen=True)
class Cluster:
    """The machine of a source, as far as the source describes it."""

    name: str
    gpu: str
    gpus_per_node: int
    network: str
    description: str


@dataclass(frozen=True)
class HopperRun:
    """One published training measurement and every setting of it that the source (or the
    configuration it points to) gives. None: not published; `assumed` maps such a field to
    what a simulation would have to take, and why. `dp` is data-parallel replicas of the
    model (FSDP shards count as DP); `fsdp` says how DP is sharded."""

    source: str
    label: str
    model: Model
    cluster: Cluster
    gpus: int
    seq_length: int
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    global_batch_size: int          # sequences per iteration
    micro_batch_size: int | None
    vpp: int | None                 # virtual stages per pipeline rank; 1 = not interleaved
    sequence_parallel: bool | None
    dtype: str                      # "bf16" or "fp8" (FP8 GEMMs over a BF16 model)
    fp8_recipe: str | None
    recompute: str | None           # "none", "selective", "full"
    dp_sharding: str | None         # "ddp", "distributed-optimizer", "fsdp-full", ...
    overlap: str | None
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu_percent: float | None = None
    hfu_percent: float | None = None
    step_time_s: float | None = None
    flop_formula: str = ""          # key of the source's formula (module docstring)
    peak_tflops: float | None = None  # what the source's MFU divides by
    nodes: int | None = None
    grad_accum: int | None = None   # as printed (None: not printed)
    params_published: int | None = None
    extra: dict = field(default_factory=dict, compare=False)  # further printed columns
    assumed: dict = field(default_factory=dict, compare=False)
    notes: str = ""
    attention_backend: str = "auto"  # the flash kernel the framework runs (module docstring)

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_length

    @property
    def num_microbatches(self) -> int | None:
        """Micro-batches per pipeline per iteration, B / (dp * MBS), when MBS is known."""
        if self.micro_batch_size is None:
            return None
        return self.global_batch_size // (self.dp * self.micro_batch_size)


# --- models ------------------------------------------------------------------------------

_MLM_CFG = ("Megatron-LM README model table (heads, hidden, layers); V=131,072, s=4096 from "
            "its text; f=4h, MHA, GeLU not stated: Megatron defaults")


def _mlm_model(label: str, heads: int, hidden: int, layers: int) -> Model:
    return Model(f"mlm-gpt-{label.lower()}", layers, hidden, 4 * hidden, heads, heads,
                 131072, False, _MLM_CFG)


GPT3_175B = Model("gpt3-175b", 96, 12288, 49152, 96, 96, 51200, False,
                  "Brown et al. 2020 Table 2.1; NeMo GPTConfig175B; NeMo vocab map 51,200",
                  preset="gpt3-175b")
LLAMA2_7B = Model("llama2-7b", 32, 4096, 11008, 32, 32, 32000, True,
                  "NeMo Llama2Config7B (llama.py); NeMo LLM_VOCAB_SIZE_MAP llama2 32,000")
LLAMA2_70B = Model("llama2-70b", 80, 8192, 28672, 64, 8, 32000, True,
                   "NeMo Llama2Config70B (llama.py); vocabulary 32,000")
_L3 = ("Llama 3 paper Table 3; HF meta-llama/Llama-3.1-* config.json (vocab 128,256); "
       "NeMo Llama3Config8B/70B, Llama31Config405B")
LLAMA3_8B = Model("llama3-8b", 32, 4096, 14336, 32, 8, 128256, True, _L3, preset="llama3-8b")
LLAMA3_70B = Model("llama3-70b", 80, 8192, 28672, 64, 8, 128256, True, _L3,
                   preset="llama3-70b")
LLAMA3_405B = Model("llama3-405b", 126, 16384, 53248, 128, 8, 128256, True, _L3,
                    preset="llama3-405b")
MIXTRAL_8X7B = Model("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, True,
                     "NeMo MixtralConfig (8 experts, top-2); vocabulary 32,000",
                     num_experts=8, moe_router_topk=2, preset="mixtral-8x7b")


def _mpt(size: str, layers: int, hidden: int, heads: int) -> Model:
    return Model(f"mpt-{size}", layers, hidden, 4 * hidden, heads, heads, 50368, False,
                 f"llm-foundry scripts/train/yamls/pretrain/mpt-{size}.yaml at 5e85bd62 "
                 f"(d_model, n_heads, n_layers, expansion_ratio 4, vocab_size 50368)")


MPT_70B = _mpt("70b", 80, 8192, 64)
MPT_13B = _mpt("13b", 40, 5120, 40)
MPT_7B = _mpt("7b", 32, 4096, 32)
MPT_3B = _mpt("3b", 32, 2560, 20)

# --- clusters ----------------------------------------------------------------------------

_DGX_NET = ("not stated by the source; a DGX H100 has 8 ConnectX-7 400 Gb/s InfiniBand "
            "ports for compute (NVIDIA DGX H100 datasheet): assumed")
MLM_H100 = Cluster("NVIDIA H100 cluster (Megatron-LM README)", "H100 (SXM assumed)", 8,
                   _DGX_NET, "up to 6144 H100 GPUs; nothing else stated")
DGX_H100 = Cluster("DGX-H100", "H100 SXM 80GB", 8, _DGX_NET,
                   "NeMo performance summary, 'System: DGX-H100'")
DGX_B200 = Cluster("DGX-B200", "B200", 8,
                   "not stated by the source; DGX B200: 8 x 400 Gb/s ConnectX-7 (datasheet)",
                   "NeMo performance summary 25.02, 'System: DGX-B200'")
META_ROCE = Cluster("Meta 24K-GPU RoCE cluster", "H100 SXM 80GB HBM3, 700 W", 8,
                    "RoCE, 400 Gbps between GPUs, three-layer Clos (Arista 7800, Minipack2)",
                    "Llama 3 paper section 3.3.1; Grand Teton servers, 8 GPUs on NVLink")
GRAND_TETON_500W = Cluster("Grand Teton (torchtitan)", "H100 96GB HBM2e, 500 W limit", 8,
                           "400 Gb/s RDMA per GPU",
                           "torchtitan benchmarks: not a stock H100 SXM 80GB; the file's "
                           "footnote puts its peak between SXM and NVL")
WHITEFIBER_H200 = Cluster("WhiteFiber H200 (Trainy)", "H200", 8,
                          "400 Gb/s RDMA per GPU (Mellanox CX-7)",
                          "8 H200 per host on NVLink")
MOSAIC_H100 = Cluster("MosaicML platform H100", "H100 80GB (h100_80gb)", 8,
                      "not stated", "llm-foundry README: GPU column 'h100_80gb'")

# --- rows: MLM ---------------------------------------------------------------------------

_MLM_NOTES = ("Megatron-LM README model table (Megatron-Core r0.8.0): TP, PP, DP, GPUs, "
              "batch, per-GPU TFLOP/s, MFU, aggregate PFLOP/s as printed.")
_MLM_ASSUMED = {
    "micro_batch_size": "1 (Megatron default; not published)",
    "vpp": "1 (no --num-layers-per-virtual-pipeline-stage published)",
    "sequence_parallel": "True when TP>1 (--tp-comm-overlap requires it)",
    "recompute": "none (Megatron default)",
    "dtype": "bf16 (MFU is over the BF16 peak)",
    "dp_sharding": "distributed-optimizer (--overlap-param-gather requires it)",
}


def _mlm(label, heads, hidden, layers, tp, pp, dp, gpus, batch, tflops, mfu, pflops):
    return HopperRun(
        source="MLM", label=label, model=_mlm_model(label, heads, hidden, layers),
        cluster=MLM_H100, gpus=gpus, seq_length=4096, tp=tp, pp=pp, cp=1, ep=1, dp=dp,
        global_batch_size=batch, micro_batch_size=None, vpp=None, sequence_parallel=None,
        dtype="bf16", fp8_recipe=None, recompute=None, dp_sharding=None,
        overlap="--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap; PP overlap",
        tflops_per_gpu=tflops, mfu_percent=mfu, flop_formula="megatron",
        peak_tflops=H100_BF16_PEAK_MLM, nodes=gpus // 8,
        extra={"aggregate_pflops": pflops}, assumed=_MLM_ASSUMED, notes=_MLM_NOTES)


MLM_WEAK_SCALING: tuple[HopperRun, ...] = (
    # size, heads, hidden, layers, TP, PP, DP, GPUs, batch, TFLOP/s/GPU, MFU %, PFLOP/s
    _mlm("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8, 41, 19.6),
    _mlm("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9, 47, 44.7),
    _mlm("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1, 49, 93.9),
    _mlm("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6, 46, 176.5),
    _mlm("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7, 42, 322.3),
    _mlm("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5, 43, 645.9),
    _mlm("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8, 44, 997.2),
    _mlm("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4, 48, 1457.4),
    _mlm("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9, 47, 2825.6),
)

# --- rows: NeMo ----------------------------------------------------------------------------

_NEMO_ASSUMED = {
    "sequence_parallel": "True when TP>1 (NeMo performance recipes)",
    "recompute": "none (not in the table)",
    "dp_sharding": "distributed-optimizer (NeMo performance recipes)",
    "fp8_recipe": "not stated in the 24.07 or 25.02 tables (the 25.04 page states per-tensor "
                  "current scaling); take Transformer Engine's, recipe by recipe",
}


def _nemo(source, label, model, cluster, gpus, gbs, mbs, seq, tp, pp, cp, vp, tps, tflops,
          ep=1, ga=None, notes=""):
    dp = gpus // (tp * pp * cp)
    return HopperRun(
        source=source, label=label, model=model, cluster=cluster, gpus=gpus, seq_length=seq,
        tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, global_batch_size=gbs, micro_batch_size=mbs,
        vpp=vp, sequence_parallel=None, dtype="fp8", fp8_recipe=None, recompute=None,
        dp_sharding=None, overlap=None, tokens_per_s_per_gpu=tps, tflops_per_gpu=tflops,
        flop_formula="megatron", nodes=gpus // 8, grad_accum=ga, assumed=_NEMO_ASSUMED,
        notes=notes)


_N24 = "NeMo 24.07 performance summary, Pretraining table (FP8, DGX-H100)"
NEMO_2407_H100: tuple[HopperRun, ...] = (
    # label, model, GPUs, GBS, MBS, seq, TP, PP, CP, VP, tokens/s/GPU, TFLOP/s/GPU
    _nemo("NEMO2407", "GPT3-175B 128", GPT3_175B, DGX_H100, 128, 256, 1, 2048, 4, 8, 1, 6,
          716, 771, notes=_N24),
    _nemo("NEMO2407", "GPT3-175B 512", GPT3_175B, DGX_H100, 512, 2048, 2, 2048, 4, 8, 1, 6,
          825, 888, notes=_N24 + "; the 888 links to MLCommons training results"),
    _nemo("NEMO2407", "LLAMA2-7B", LLAMA2_7B, DGX_H100, 8, 128, 1, 4096, 1, 1, 1, 1,
          16934, 780, notes=_N24),
    _nemo("NEMO2407", "LLAMA2-70B", LLAMA2_70B, DGX_H100, 64, 128, 1, 4096, 4, 4, 1, 20,
          1728, 768, notes=_N24),
    _nemo("NEMO2407", "LLAMA3-8B", LLAMA3_8B, DGX_H100, 8, 128, 1, 8192, 1, 1, 2, 1,
          12273, 711, notes=_N24),
    _nemo("NEMO2407", "LLAMA3-70B", LLAMA3_70B, DGX_H100, 64, 128, 1, 8192, 4, 4, 2, 5,
          1524, 734, notes=_N24),
)

_N25 = "NeMo 25.02 performance summary, Pretraining table (FP8, NeMo 2.0)"
NEMO_2502: tuple[HopperRun, ...] = (
    # ..., VP, tokens/s/GPU, TFLOP/s/GPU, EP, GA
    _nemo("NEMO2502", "GPT3-175B B200", GPT3_175B, DGX_B200, 512, 2048, 2, 2048, 4, 4, 1, 6,
          1600, 1722, ep=1, ga=32, notes=_N25 + ", DGX-B200"),
    _nemo("NEMO2502", "LLAMA3-8B B200", LLAMA3_8B, DGX_B200, 8, 128, 2, 8192, 1, 1, 1, 1,
          26006, 1506, ep=1, ga=8, notes=_N25 + ", DGX-B200"),
    _nemo("NEMO2502", "LLAMA3-70B B200", LLAMA3_70B, DGX_B200, 64, 128, 1, 8192, 2, 4, 2, 5,
          3062, 1474, ep=1, ga=32, notes=_N25 + ", DGX-B200"),
    _nemo("NEMO2502", "LLAMA3-405B B200", LLAMA3_405B, DGX_B200, 128, 64, 1, 8192, 4, 8, 2, 8,
          625, 1658, ep=1, ga=32,
          notes=_N25 + ", DGX-B200. Its TFLOP/s over tokens/s is 1.0 % above the Megatron "
          "formula for this shape (every other NeMo row agrees to rounding); unexplained, "
          "so time from tokens/s and FLOPs from the formula disagree by 1 %."),
    _nemo("NEMO2502", "Mixtral-8x7B B200", MIXTRAL_8X7B, DGX_B200, 64, 256, 2, 4096, 1, 1, 1,
          1, 15457, 1282, ep=8, ga=2, notes=_N25 + ", DGX-B200 (EP 8 inside DP 64)"),
    _nemo("NEMO2502", "GPT3-175B H100", GPT3_175B, DGX_H100, 512, 2048, 2, 2048, 4, 8, 1, 6,
          866, 932, ep=1, ga=64, notes=_N25 + ", DGX-H100 (first row of that table)"),
)

# --- rows: Llama 3 -------------------------------------------------------------------------

_L3_ASSUMED = {
    "micro_batch_size": "1 (not published; section 3.3.2 tunes the micro-batch count)",
    "vpp": "interleaved schedule (section 3.3.2), stages per rank not published",
    "recompute": "not published; none taken. The memory model then puts ranks over 80 GB, "
                 "and with selective recompute too; full recompute fits (about 20 GB) but "
                 "simulates 16-30% slower than published (2026-11-25), so the run saved "
                 "memory in ways the paper does not detail",
    "sequence_parallel": "not published (TP 8 inside a server)",
}


def _llama3(label, gpus, tp, cp, pp, dp, seq, batch_per_dp, tflops, mfu, notes=""):
    return HopperRun(
        source="LLAMA3", label=label, model=LLAMA3_405B, cluster=META_ROCE, gpus=gpus,
        seq_length=seq, tp=tp, pp=pp, cp=cp, ep=1, dp=dp,
        global_batch_size=dp * batch_per_dp, micro_batch_size=None, vpp=None,
        sequence_parallel=None, dtype="bf16", fp8_recipe=None, recompute=None,
        dp_sharding="fsdp (parameters kept after forward, ZeRO-2-like; section 3.3.2)",
        overlap="not published", tflops_per_gpu=tflops, mfu_percent=mfu,
        flop_formula="palm", peak_tflops=H100_BF16_PEAK_MLM, nodes=gpus // 8,
        extra={"batch_size_per_dp": batch_per_dp, "tokens_per_batch": "16M"},
        assumed=_L3_ASSUMED,
        notes="Llama 3 paper Table 4 (GPUs, TP, CP, PP, DP, seq, batch/DP, tokens/batch, "
              "TFLOPs/GPU, BF16 MFU). " + notes)


LLAMA3_TABLE_4: tuple[HopperRun, ...] = (
    _llama3("8K GPUs, 8K seq", 8192, 8, 1, 16, 64, 8192, 32, 430, 43),
    _llama3("16K GPUs, 8K seq", 16384, 8, 1, 16, 128, 8192, 16, 400, 41,
            "400/989 is 40.4 %, printed 41 %: the TFLOPs column reads as rounded to tens."),
    _llama3("16K GPUs, 128K seq", 16384, 8, 16, 16, 8, 131072, 16, 380, 38,
            "DP is 8 in v3; some copies (an earlier version, as extracted) print 4, which "
            "does not multiply out to 16,384 GPUs or 16M tokens."),
)

# --- rows: torchtitan (H100 96GB, 500 W) ---------------------------------------------------

_TITAN_FILE = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
_SDPA_H100 = "flash"  # torchtitan's SDPA: FLASH first, CUDNN only on sm100 (module docstring)


def _titan(label, model, gpus, fsdp, tp, pp, cp, local_batch, seq, tps, dtype, recompute,
           compile_, notes, vpp=1, micro_batch_size=None, assumed=None):
    extras = {"torch.compile": compile_}
    return HopperRun(
        source="TITAN", label=label, model=model, cluster=GRAND_TETON_500W, gpus=gpus,
        seq_length=seq, tp=tp, pp=pp, cp=cp, ep=1, dp=fsdp,
        global_batch_size=local_batch * fsdp,
        micro_batch_size=local_batch if pp == 1 else micro_batch_size, vpp=vpp,
        sequence_parallel=(tp > 1), dtype=dtype,
        fp8_recipe="torchao Float8Linear, dynamic tensorwise scaling" if dtype == "fp8" else None,
        recompute=recompute, dp_sharding="fsdp-full (FSDP2)",
        overlap="AsyncTP" if "AsyncTP" in notes else None,
        tokens_per_s_per_gpu=tps, flop_formula="titan", peak_tflops=H100_BF16_PEAK_TITAN,
        nodes=gpus // 8, extra=extras, attention_backend=_SDPA_H100,
        assumed={"seq_length": "8192 from train_configs toml (not in the tables)",
                 **(assumed or {})},
        notes=f"{_TITAN_FILE}: {notes}")


_PP_ASSUMED = {"micro_batch_size": "4: local batch 32 over the default 8 micro-batches "
                                   "(--experimental.pipeline_parallel_microbatches unset)"}
TITAN_2412: tuple[HopperRun, ...] = (
    _titan("8B FSDP 8", LLAMA3_8B, 8, 8, 1, 1, 1, 2, 8192, 5762, "bf16", "selective", False,
           "Table 1, FSDP, local batch 2, global 16, selective AC"),
    _titan("8B FSDP 8 compile fp8", LLAMA3_8B, 8, 8, 1, 1, 1, 2, 8192, 8532, "fp8",
           "selective", True, "Table 1, FSDP + torch.compile + Float8"),
    _titan("8B FSDP 128", LLAMA3_8B, 128, 128, 1, 1, 1, 2, 8192, 5605, "bf16", "selective",
           False, "Table 3, FSDP, local batch 2, global 256, selective AC"),
    _titan("8B FSDP 128 compile fp8", LLAMA3_8B, 128, 128, 1, 1, 1, 2, 8192, 8380, "fp8",
           "selective", True, "Table 3, FSDP + torch.compile + Float8"),
    _titan("8B FSDP 4 CP 2 64K", LLAMA3_8B, 8, 4, 1, 1, 2, 1, 65536, 2540, "fp8", "full", True,
           "Table 2, FSDP 4 CP 2, sequence 65536 (stated), local batch 1, full AC, "
           "torch.compile + Float8"),
    _titan("70B FSDP 32 TP 8", LLAMA3_70B, 256, 32, 8, 1, 1, 16, 8192, 829, "fp8", "full",
           True, "Table 4, 2D (FSDP 32, TP 8), local batch 16, global 512, full AC, "
           "torch.compile + Float8"),
    _titan("70B FSDP 32 TP 8 AsyncTP", LLAMA3_70B, 256, 32, 8, 1, 1, 16, 8192, 876, "fp8",
           "full", True, "Table 4, 2D + AsyncTP"),
    _titan("405B 3D 1F1B", LLAMA3_405B, 512, 8, 8, 8, 1, 32, 8192, 100, "fp8", "full", True,
           "Table 5, FSDP 8 TP 8 PP 8, schedule 1F1B, local batch 32, global 256, full AC, "
           "torch.compile + Float8 + AsyncTP", assumed=_PP_ASSUMED),
    _titan("405B 3D Interleaved 1F1B", LLAMA3_405B, 512, 8, 8, 8, 1, 32, 8192, 128, "fp8",
           "full", True, "Table 5, schedule Interleaved 1F1B (2 stages per rank by the default "
           "split), torch.compile + Float8 + AsyncTP", vpp=2, assumed=_PP_ASSUMED),
)

# --- rows: Trainy on H200 (torchtitan) -----------------------------------------------------


def _trainy(nodes: int, tps: float) -> HopperRun:
    gpus = 8 * nodes
    return HopperRun(
        source="TRAINY", label=f"8B FSDP {gpus} H200", model=LLAMA3_8B,
        cluster=WHITEFIBER_H200, gpus=gpus, seq_length=8192, tp=1, pp=1, cp=1, ep=1, dp=gpus,
        global_batch_size=2 * gpus, micro_batch_size=2, vpp=1, sequence_parallel=False,
        dtype="fp8", fp8_recipe="torchao float8 tensorwise; FP8 FSDP all-gather, precomputed "
        "dynamic scales, FP8 weights recomputed in backward",
        recompute="selective", dp_sharding="fsdp-full (FSDP2)", overlap=None,
        tokens_per_s_per_gpu=tps, flop_formula="titan", nodes=nodes,
        extra={"torch.compile": True}, attention_backend=_SDPA_H100,
        notes="torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md: command line "
              "(--training.local_batch_size=2, --training.compile, float8 converters) and "
              "TPS/GPU; sequence 8192, selective per-op AC and FSDP over all GPUs from "
              "llama3_8b.toml at e7c0cae.")


TRAINY_H200: tuple[HopperRun, ...] = (_trainy(4, 10938), _trainy(8, 10753))

# --- rows: MosaicML llm-foundry ------------------------------------------------------------


def _mosaic(model, seq, gpus, mfu, hfu, model_tflop, mbs, ga, gbs, sps, tps, tps_gpu,
            gbs_tokens, precision, sharding, act_ckpt, params, table):
    fp8 = precision == "amp_fp8"
    return HopperRun(
        source="MOSAIC", label=f"{model.name} {gpus} {precision}", model=model,
        cluster=MOSAIC_H100, gpus=gpus, seq_length=seq, tp=1, pp=1, cp=1, ep=1, dp=gpus,
        global_batch_size=gbs, micro_batch_size=mbs, vpp=1, sequence_parallel=False,
        dtype="fp8" if fp8 else "bf16",
        fp8_recipe="Transformer Engine via Composer amp_fp8 (recipe not stated)" if fp8 else None,
        recompute="full" if act_ckpt else "none",
        dp_sharding={"FULL_SHARD": "fsdp-full", "SHARD_GRAD_OP": "fsdp-grad-op"}[sharding],
        overlap="FSDP limit_all_gathers (yaml); MP mode DEFAULT",
        tokens_per_s_per_gpu=tps_gpu, tflops_per_gpu=model_tflop, mfu_percent=mfu,
        hfu_percent=hfu, flop_formula="mosaic",
        peak_tflops=H100_FP8_PEAK_COMPOSER if fp8 else H100_BF16_PEAK_COMPOSER,
        nodes=gpus // 8, grad_accum=ga, params_published=params,
        extra={"throughput_samples_per_s": sps, "throughput_tokens_per_s": tps,
               "global_batch_tokens": gbs_tokens, "precision": precision},
        attention_backend="flash",
        assumed={"attention_backend": "flash (FlashAttention-2): the README's FlashAttention; "
                                      "the yaml's 'triton' is overridden (not printed)"},
        notes=f"llm-foundry benchmarking README, table '{table}'; every column typed "
              f"(GPU column 'h100_80gb', CPU offload False). Attention implementation: "
              f"'triton' in the yaml, FlashAttention per the README text.")


_LS = "H100 80GB BF16 (Large Scale, >= 128 GPUs)"
MOSAIC_H100_RUNS: tuple[HopperRun, ...] = (
    # model, seq, GPUs, MFU, HFU, Model TFLOP, MBS, GA, GBS, S/s, T/s, T/s/GPU, GBS(T),
    # precision, sharding, activation checkpointing, NumParams
    _mosaic(MPT_70B, 2048, 512, 41.25, 55.0, 408, 8, 1, 4096, 251, 515636, 1007, 8388608,
            "amp_bf16", "FULL_SHARD", True, 64862437376, _LS),
    _mosaic(MPT_70B, 2048, 128, 43.36, 57.81, 428, 8, 1, 1024, 66, 135490, 1058, 2097152,
            "amp_bf16", "FULL_SHARD", True, 64862437376, _LS),
    _mosaic(MPT_13B, 2048, 512, 41.12, 54.83, 406, 16, 1, 8192, 1238, 2535811, 4952, 16777216,
            "amp_bf16", "FULL_SHARD", True, 12853954560, _LS),
    _mosaic(MPT_7B, 2048, 512, 42.2, 42.2, 417, 6, 1, 3072, 2417, 4951479, 9670, 6291456,
            "amp_bf16", "FULL_SHARD", False, 6658859008, _LS),
    _mosaic(MPT_7B, 2048, 128, 45.71, 45.71, 452, 6, 1, 768, 654, 1340830, 10475, 1572864,
            "amp_bf16", "FULL_SHARD", False, 6658859008, _LS),
    _mosaic(MPT_3B, 2048, 8, 27.7, 27.7, 548, 10, 6, 480, 119, 244692, 30586, 983040,
            "amp_fp8", "FULL_SHARD", False, 2651837440, "H100 80GB FP8"),
)

PUBLISHED_RUNS: tuple[HopperRun, ...] = (
    MLM_WEAK_SCALING + NEMO_2407_H100 + NEMO_2502 + LLAMA3_TABLE_4 + TITAN_2412 + TRAINY_H200
    + MOSAIC_H100_RUNS)

# --- FLOP formulas and iteration times ----------------------------------------------------


def megatron_flops(model: Model, batch: int, seq: int) -> float:
    """Megatron-LM `num_floating_point_operations` (r0.8, f2e5db40), also NeMo's model FLOPs
    up to 2025-08: 12*B*s*l*h^2*((1 + g/a + s/h) + (f/h)*k*(1.5 if SwiGLU) + V/(2lh)),
    k = top-k (1 if dense); no causal discount, no recompute, no router."""
    l, h, a = model.num_layers, model.hidden_size, model.num_attention_heads
    g, f, V = model.num_query_groups, model.ffn_hidden_size, model.vocab_size
    k = model.moe_router_topk or 1
    gated = 1.5 if model.swiglu else 1.0
    return 12 * batch * seq * l * h * h * ((1 + g / a + seq / h) + (f / h) * k * gated
                                           + V / (2 * l * h))


def palm_flops_per_token(model: Model, seq: int) -> float:
    """PaLM appendix B: 6N + 12*l*h*s, N = ModelSpec's parameter count (both embeddings;
    our reading, the Llama 3 paper names no N)."""
    n = model.spec(seq).param_count()
    return 6 * n + 12 * model.num_layers * model.hidden_size * seq


def titan_flops_per_token(model: Model, seq: int) -> float:
    """torchtitan get_num_flop_per_token at 9dec370: 6N + 12*l*h*s, N without the token
    embedding (the output projection counts)."""
    spec = model.spec(seq)
    return 6 * (spec.param_count() - spec.embedding_param_count()) \
        + 12 * model.num_layers * model.hidden_size * seq


def mosaic_flops_per_token(run: HopperRun) -> float:
    """llm-foundry collect_results.py: (6*N*s + 12*l*h*s^2) per sequence, over s."""
    s = run.seq_length
    return 6 * run.params_published + 12 * run.model.num_layers * run.model.hidden_size * s


def iteration_flops(run: HopperRun) -> float:
    """One iteration's model FLOPs by the formula the run's source uses."""
    if run.flop_formula == "megatron":
        return megatron_flops(run.model, run.global_batch_size, run.seq_length)
    per_token = {"palm": lambda: palm_flops_per_token(run.model, run.seq_length),
                 "titan": lambda: titan_flops_per_token(run.model, run.seq_length),
                 "mosaic": lambda: mosaic_flops_per_token(run)}[run.flop_formula]()
    return per_token * run.tokens_per_iteration


def iteration_time_s(run: HopperRun) -> float:
    """Seconds per iteration that the published throughput implies: from tokens/s (MOSAIC:
    the printed total tokens/s; others: per GPU * GPUs), else from TFLOP/s/GPU and the
    source's FLOP formula."""
    if run.step_time_s is not None:
        return run.step_time_s
    if run.source == "MOSAIC":
        return run.tokens_per_iteration / run.extra["throughput_tokens_per_s"]
    if run.tokens_per_s_per_gpu is not None:
        return run.tokens_per_iteration / (run.tokens_per_s_per_gpu * run.gpus)
    return iteration_flops(run) / (run.tflops_per_gpu * 1e12 * run.gpus)
