"""Published training measurements that benchmarks/fidelity.py checks clustersim against:
data with its sources, no simulation.

Units: seconds; TFLOP/s (1e12 FLOP/s) per GPU; PFLOP/s (1e15) aggregate; percentages as
the papers print them (44 means 44 %); parameters in billions.

Sources
- SC21: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC21 (arXiv:2104.04473). Table 1 (weak scaling, 1.7B to 1T) and
  section 5: mixed precision on Selene, the interleaved schedule with the scatter/gather
  optimisation, V = 51,200, s = 2048.
- run_table_1.sh: the authors' reproduction script for that table, NVIDIA/Megatron-LM
  examples/sc21/run_table_1.sh. It gives what Table 1 does not print: the micro-batch
  size (MBS), the layers per virtual pipeline stage, and full recompute ("uniform"
  activation checkpointing) on every row. Two rows (39.1B, 1T) have no virtual stages
  there although section 5.1 says the interleaved schedule was used; we follow the script.
- K22: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models" (arXiv:2205.05198, MLSys 2023). Table 3 (configurations: no data parallelism,
  micro-batch sizes), Table 5 (end-to-end iteration time, full recompute vs the paper's
  sequence parallelism + selective recompute, MFU and HFU of the latter), Table 4 (one
  22B layer's times), section 6 (Selene; three interleaved stages for 175B and 530B; the
  530B at 8-way data parallelism, also in the abstract), Appendix A (FLOPs).

FLOP formulas (B global batch, s sequence, l layers, h hidden, V vocab), all equal to
`ModelSpec.iteration_flops` for these GPT shapes (tests/test_model.py checks eq. 3):
- SC21 eq. (3): F = 96Bslh^2 (1 + s/6h + V/16lh), GEMMs only, counting full recompute's
  extra forward. Table 1's TFLOP/s per GPU = F / (iteration time * GPUs); its aggregate
  PFLOP/s = that * GPUs. The paper prints no iteration times; `implied_iteration_time_s`
  derives them.
- K22 eq. (7), model FLOPs: 72Blsh^2 (1 + s/6h + V/12hl), forward + backward, no recompute.
- K22 eq. (8), hardware FLOPs with selective recompute: 72Blsh^2 (1 + s/3h + V/12hl). Its
  s/3h adds 12Bls^2h to eq. (7), three times the 4Bls^2h that re-running QK^T and
  attention over V costs by the paper's own derivation; Table 5's HFU follows eq. (8) as
  printed (tests/test_fidelity_data.py), so HFU comparisons must use it as printed.
- MFU (HFU) = eq. (7) (eq. (8)) / (iteration time * GPUs * 312 TFLOP/s).

Not found, so not typed here: per-row iteration times of SC21 Table 1; K22's MFU/HFU for
the full-recompute runs (only derivable: eq. (7) over the time) and the iteration time of
the full-recompute 530B run on 2240 GPUs (only its 42.1 % MFU is stated); the setup of
K22 Table 4 beyond the 22B configuration of Table 3 (the footnote was not available).
Left out as rows because their tensor x pipeline split is not printed: SC21 Table 2's PTD
runs (model-parallel size 96 for 174.6B, 280 for 529.6B, micro-batch 1) and section 5.1's
GPT-3 estimate (1024 GPUs, batch 1536, 140 TFLOP/s per GPU).
"""
from __future__ import annotations

from dataclasses import dataclass

from clustersim.schedules.model import ModelSpec
from clustersim.schedules.model_presets import get_model


@dataclass(frozen=True)
class Cluster:
    """The machine a paper measured on. `topology` names clustersim's preset of it."""

    name: str
    topology: str
    gpu: str
    gpus_per_node: int
    peak_tflops: float
    nic_gbps_per_gpu: int
    description: str


SELENE = Cluster(
    name="Selene", topology="selene-a100", gpu="A100 SXM4 80GB", gpus_per_node=8,
    peak_tflops=312.0, nic_gbps_per_gpu=200,
    description="NVIDIA DGX SuperPOD: DGX A100 nodes of 8 A100 80GB on NVLink/NVSwitch, "
                "8 Mellanox HDR InfiniBand HCAs (200 Gb/s) per node for application "
                "traffic plus 2 for storage, three-level (leaf, spine, core) fat tree of "
                "850 switches; 312 TFLOP/s peak per GPU in 16-bit (SC21 section 5; K22 "
                "section 6).")


@dataclass(frozen=True)
class PublishedRun:
    """One measured training configuration and what its paper reports.

    Shape fields are as the paper's table prints them (`model` names the clustersim
    preset with that shape). `dp` is stated (K22) or GPUs / (tp * pp) (SC21 prints no DP
    column). `virtual_stages` is the interleaving degree (1: not interleaved).
    Measurements a paper does not give are None; `notes` says where each number comes from.
    `dtype`: the run's training precision (SC21's scripts train in fp16; bf16 where none
    is named).
    """

    source: str
    label: str
    model: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    tp: int
    pp: int
    dp: int
    gpus: int
    global_batch_size: int
    micro_batch_size: int
    virtual_stages: int
    recompute: str
    sequence_parallel: bool
    seq_length: int = 2048
    vocab_size: int = 51200
    params_billion: float | None = None
    iteration_time_s: float | None = None
    tflops_per_gpu: float | None = None
    percent_of_peak: float | None = None
    aggregate_pflops: float | None = None
    mfu_percent: float | None = None
    hfu_percent: float | None = None
    cluster: Cluster = SELENE
    notes: str = ""
    dtype: str = "bf16"

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per iteration: B / (dp * micro-batch size)."""
        return self.global_batch_size // (self.dp * self.micro_batch_size)


_SC21_NOTES = ("SC21 Table 1 (params, heads, hidden, layers, t, p, GPUs, batch, TFLOP/s, "
               "% of peak, PFLOP/s); dp = GPUs/(t*p); micro-batch, virtual stages and "
               "full recompute from run_table_1.sh; fp16 from CONFIG.sh (--fp16, "
               "--loss-scale 8192); no sequence parallelism (it postdates the paper).")


def _sc21(label: str, params: float, heads: int, hidden: int, layers: int, tp: int, pp: int,
          gpus: int, batch: int, tflops: int, percent: int, pflops: float, mbs: int,
          layers_per_virtual_stage: int | None) -> PublishedRun:
    """A Table 1 row in the table's column order, then run_table_1.sh's MBS and
    --num-layers-per-virtual-pipeline-stage (None: the flag is absent)."""
    layers_per_stage = layers // pp
    vpp = layers_per_stage // layers_per_virtual_stage if layers_per_virtual_stage else 1
    name = "sc21-1t" if label == "1T" else f"sc21-{label.lower()}"
    return PublishedRun(
        source="SC21 Table 1", label=label, model=name, num_layers=layers, hidden_size=hidden,
        num_attention_heads=heads, tp=tp, pp=pp, dp=gpus // (tp * pp), gpus=gpus,
        global_batch_size=batch, micro_batch_size=mbs, virtual_stages=vpp,
        recompute="full", sequence_parallel=False, params_billion=params,
        tflops_per_gpu=tflops, percent_of_peak=percent, aggregate_pflops=pflops,
        notes=_SC21_NOTES, dtype="fp16")


SC21_TABLE_1: tuple[PublishedRun, ...] = (
    # label, params, heads, hidden, layers, t, p, GPUs, batch, TFLOP/s, %, PFLOP/s; MBS, l/vs
    _sc21("1.7B", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4, 16, None),
    _sc21("3.6B", 3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 8.8, 16, None),
    _sc21("7.5B", 7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 18.2, 16, None),
    _sc21("18.4B", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 34.6, 8, None),
    _sc21("39.1B", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 70.8, 4, None),
    _sc21("76.1B", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 143.8, 2, 5),
    _sc21("145.6B", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 227.1, 2, 5),
    _sc21("310.1B", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 297.4, 1, 3),
    _sc21("529.6B", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 410.2, 1, 1),
    _sc21("1T", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 502.0, 1, None),
)

_K22_NOTES = ("K22 Table 3 (shape, t, p, GPUs, global and micro-batch; no data "
              "parallelism) and Table 5 (iteration time; MFU/HFU for the present-work run "
              "only); interleaving from section 6 (three stages for 175B and 530B, none "
              "named for 22B (p=1) and 1T).")

# (label, preset, layers, hidden, heads, t, p, GPUs, batch, micro-batch, virtual stages,
#  seconds with full recompute, seconds with SP + selective, MFU %, HFU %)
_K22_TABLE_5 = (
    ("22B", "k22-22b", 48, 6144, 64, 8, 1, 8, 4, 4, 1, 1.42, 1.10, 41.5, 43.7),
    ("175B", "gpt3-175b", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75, 51.4, 52.8),
    ("530B", "sc21-529.6b", 105, 20480, 128, 8, 35, 280, 280, 1, 3, 49.05, 37.83, 56.0, 57.0),
    ("1T", "sc21-1t", 128, 25600, 160, 8, 64, 512, 512, 1, 1, 94.42, 71.49, 56.3, 57.0),
)


def _k22_pair(label, preset, layers, hidden, heads, tp, pp, gpus, batch, mbs, vpp,
              full_s, present_s, mfu, hfu) -> tuple[PublishedRun, PublishedRun]:
    common = dict(label=label, model=preset, num_layers=layers, hidden_size=hidden,
                  num_attention_heads=heads, tp=tp, pp=pp, dp=1, gpus=gpus,
                  global_batch_size=batch, micro_batch_size=mbs, virtual_stages=vpp,
                  notes=_K22_NOTES)
    return (PublishedRun(source="K22 Table 5", recompute="full", sequence_parallel=False,
                         iteration_time_s=full_s, **common),
            PublishedRun(source="K22 Table 5", recompute="selective", sequence_parallel=True,
                         iteration_time_s=present_s, mfu_percent=mfu, hfu_percent=hfu,
                         **common))


K22_TABLE_5: tuple[PublishedRun, ...] = tuple(
    run for row in _K22_TABLE_5 for run in _k22_pair(*row))

# Table 5's "throughput increase" of SP + selective over full recompute, per model.
K22_THROUGHPUT_INCREASE_PERCENT = {"22B": 29.0, "175B": 31.8, "530B": 29.7, "1T": 32.1}

# K22 section 6.3 (and abstract): the 530B of Table 3 at 8-way data parallelism, batch per
# model instance kept (280 x 8), no overlap of the gradient all-reduce with backward.
K22_530B_DP8 = PublishedRun(
    source="K22 section 6.3", label="530B dp8", model="sc21-529.6b", num_layers=105,
    hidden_size=20480, num_attention_heads=128, tp=8, pp=35, dp=8, gpus=2240,
    global_batch_size=2240, micro_batch_size=1, virtual_stages=3, recompute="selective",
    sequence_parallel=True, iteration_time_s=39.15, mfu_percent=54.2,
    notes="K22 section 6.3: 37.83 s -> 39.15 s and MFU 56.0 % -> 54.2 % at 8-way data "
          "parallelism; the abstract gives 42.1 % MFU for full recompute on the same 2240 "
          "GPUs, whose iteration time is not stated.")

# K22 Table 4: one layer of the 22B model (Table 3: t=8, micro-batch 4, s=2048), forward
# and backward milliseconds, and the overhead over the baseline's combined time.
# (experiment, forward ms, backward ms, combined ms, overhead %)
K22_TABLE_4_LAYER_MS = (
    ("baseline, no recompute", 7.7, 11.9, 19.6, None),
    ("sequence parallelism", 7.2, 11.8, 19.0, -3),
    ("baseline with full recompute", 7.7, 19.5, 27.2, 39),
    ("selective recompute", 7.7, 13.2, 20.9, 7),
    ("selective recompute + sequence parallelism", 7.2, 13.1, 20.3, 4),
)

PUBLISHED_RUNS: tuple[PublishedRun, ...] = SC21_TABLE_1 + K22_TABLE_5 + (K22_530B_DP8,)


def model_spec(run: PublishedRun) -> ModelSpec:
    """The clustersim preset of `run`, at the run's micro-batch size and dtype."""
    return get_model(run.model, micro_batch_size=run.micro_batch_size, dtype=run.dtype)


def sc21_flops(run: PublishedRun) -> int:
    """SC21 eq. (3) for one iteration of `run`: 96Bslh^2(1 + s/6h + V/16lh)."""
    one = get_model(run.model, micro_batch_size=1)
    return one.iteration_flops(run.global_batch_size, recompute=True)


def k22_model_flops(run: PublishedRun) -> int:
    """K22 eq. (7), model FLOPs of one iteration: 72Blsh^2(1 + s/6h + V/12hl)."""
    return get_model(run.model, micro_batch_size=1).iteration_flops(run.global_batch_size)


def k22_hardware_flops(run: PublishedRun) -> int:
    """K22 eq. (8) as printed, hardware FLOPs of one iteration with selective recompute:
    eq. (7) + 12Bls^2h, i.e. three core-attention forwards (see the module docstring)."""
    one = get_model(run.model, micro_batch_size=1)
    return (k22_model_flops(run)
            + 3 * run.global_batch_size * one.num_layers * one.attention_core_flops())


def implied_iteration_time_s(run: PublishedRun) -> float:
    """Iteration seconds that a run's published throughput implies: SC21 eq. (3) over
    TFLOP/s per GPU * GPUs; for K22 the published time itself."""
    if run.iteration_time_s is not None:
        return run.iteration_time_s
    return sc21_flops(run) / (run.tflops_per_gpu * 1e12 * run.gpus)
