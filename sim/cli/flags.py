"""The one table from command-line flags to the fields they set.

Each Flag names its spellings (ours first, then Megatron-LM's), the field it sets and how
argparse reads it. The model flags set ModelSpec fields (a preset's field overridden by the
Megatron-named dimension); the parallel, sharding and intra-layer flags set ParallelConfig
fields, or a spelling that schedules.parallel_aliases translates (`--bucket-mb` is torch
DDP's bucket_cap_mb in MiB, `--use-distributed-optimizer` is ZeRO-1, ...); the cost flags
choose the cost model (sim.cost_model). The parsed value's argparse dest is the field, so
`fields(args, FLAGS)` is the keyword set for the constructor; None means "not given".
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from clustersim.schedules.errors import ConfigError, require_positive_int
from clustersim.schedules.limits import MAX_OPS
from clustersim.schedules.lora import BASE_DTYPES, NEMO_TARGETS, PEFT_TARGETS
from clustersim.schedules.fp8 import DEFAULT_FP8_RECIPE, FP8_FORMATS, FP8_RECIPES
from clustersim.schedules.model import NORMALIZATIONS, POSITION_EMBEDDINGS, ModelSpec
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.parallel import (CP_COMM, FSDP, OFFLOAD_DEVICES, RECOMPUTE,
                                           ParallelConfig)
from clustersim.schedules.profile import Profile
from clustersim.schedules.recompute import METHODS as RECOMPUTE_METHODS
from clustersim.schedules.sharding import moves_gradients
from clustersim.schedules.registry import DEFAULT_SCHEDULE, SCHEDULES, schedule_help
from clustersim.topologies.attention_kernels import BACKENDS

from ..cost_model import CostModel, ProfileCostModel, RooflineCostModel, parse_uniform_costs

DEFAULT_MODEL, DEFAULT_TOPOLOGY = "llama3-8b", "dgx-h100"
DEFAULT_PP, DEFAULT_MICROBATCHES = 8, 16


@dataclass(frozen=True)
class Flag:
    """A command-line flag: `names` (ours first), the `field` it sets (its argparse
    dest), and argparse's type / action / choices / metavar / nargs / help."""

    names: tuple[str, ...]
    field: str
    help: str | None = None
    type: Callable[[str], Any] | None = None
    action: str | type[argparse.Action] | None = None
    choices: Sequence[Any] | None = None
    metavar: str | tuple[str, ...] | None = None
    nargs: int | str | None = None

    def add_to(self, group: argparse._ActionsContainer, default: Any = None,
               required: bool = False) -> None:
        options: dict[str, Any] = {"dest": self.field, "help": self.help, "default": default}
        if required:
            options["required"] = True
        if self.action:
            options["action"] = self.action
        else:
            options.update(type=self.type, choices=self.choices, metavar=self.metavar)
            if self.nargs is not None:
                options["nargs"] = self.nargs
        group.add_argument(*self.names, **options)


def _flag(names: str, field: str, help: str | None = None, **kw: Any) -> Flag:
    return Flag(tuple(names.split()), field, help, **kw)


def _switch(names: str, field: str, help: str) -> Flag:
    """An on-flag: given, it sets True; absent, the field keeps its default."""
    return _flag(names, field, help, action="store_true")


def _off(names: str, field: str, help: str) -> Flag:
    """An off-flag: given, it sets False."""
    return _flag(names, field, help, action="store_false")


def _both(names: str, field: str, help: str) -> Flag:
    """A flag given on (`--x`) or off (`--no-x`); absent, the field keeps its value."""
    return _flag(names, field, help, action=argparse.BooleanOptionalAction)


def _const(names: str, field: str, value: Any, help: str) -> Flag:
    """A flag that sets `field` to `value` (Megatron's --bf16 sets the dtype)."""

    class _Store(argparse.Action):
        def __init__(self, option_strings: Sequence[str], dest: str, **kw: Any) -> None:
            kw.pop("nargs", None)
            super().__init__(option_strings, dest, nargs=0, **kw)

        def __call__(self, parser: Any, namespace: Any, values: Any,
                     option: str | None = None) -> None:
            setattr(namespace, self.dest, value)

    return _flag(names, field, help, action=_Store)


def _names(text: str) -> tuple[str, ...]:
    """'a,b' -> ('a', 'b'), for a list flag."""
    return tuple(name.strip() for name in text.split(","))


MODEL_FLAGS = (  # ModelSpec fields, Megatron-LM's names
    _flag("--num-layers", "num_layers", type=int, metavar="INT"),
    _flag("--hidden-size", "hidden_size", type=int, metavar="INT"),
    _flag("--ffn-hidden-size", "ffn_hidden_size", "MLP width (Megatron's default: 4h, with "
          "SwiGLU int(8h/3) rounded down to a multiple of 64)", type=int, metavar="INT"),
    _flag("--num-attention-heads", "num_attention_heads", type=int, metavar="INT"),
    _flag("--num-query-groups", "num_query_groups", "KV groups (default: one per head)",
          type=int, metavar="INT"),
    _switch("--group-query-attention", "group_query_attention",
            "Megatron's switch for --num-query-groups (which needs it there; here "
            "--num-query-groups alone does it)"),
    _flag("--seq-length", "seq_length", type=int, metavar="INT"),
    _flag("--vocab-size", "vocab_size", type=int, metavar="INT"),
    _flag("--micro-batch-size", "micro_batch_size", type=int, metavar="INT"),
    _flag("--dtype", "dtype",
          "bf16, fp16, fp32 or fp8 (default bf16); fp8 = Transformer Engine's FP8 GEMMs over "
          "a bf16 model: 16-bit weights, gradients and communication but for the "
          "sequence-parallel all-gathers that feed TE's GEMMs (and --fp8-param-gather's "
          "parameter gathers); FP8 casts, weight copies "
          "and saved GEMM inputs per --fp8-recipe", type=str, metavar="STR"),
    _const("--bf16", "dtype", "bf16", "Megatron's spelling of --dtype bf16"),
    _const("--fp16", "dtype", "fp16", "Megatron's spelling of --dtype fp16"),
    _flag("--fp8-format", "fp8_format",
          "with --dtype fp8: " + "; ".join(f"{k} = {v}" for k, v in FP8_FORMATS.items())
          + " (default: the recipe's TE default); numerics only: the same bytes and speed, "
          "said in the run's notes", choices=list(FP8_FORMATS)),
    _flag("--fp8-recipe", "fp8_recipe",
          f"with --dtype fp8: Transformer Engine's scaling recipe (default "
          f"{DEFAULT_FP8_RECIPE}): delayed (amax history), tensorwise (current scaling: an "
          f"amax pass per cast), mxfp8 (Blackwell only: 1x32 E8M0 block scales), blockwise "
          f"(1x128 fp32 block scales, weights 128x128)", choices=list(FP8_RECIPES)),
    _switch("--fp8-param-gather --enable-fsdp-float8-all-gather", "fp8_param_gather",
            "with --dtype fp8 and --zero-stage >= 1: FP8 parameters (Megatron-LM; torchtitan's "
            "float8 spelling): TE's linear weights kept in FP8 without a 16-bit copy and "
            "gathered over the data-parallel ranks in FP8; not with mxfp8 or MoE"),
    _both("--swiglu", "swiglu", "SwiGLU MLP (default off: GeLU)"),
    _both("--use-flash-attn", "use_flash_attn",
          "flash attention (default: the preset's; off without a preset)"),
    _both("--fused-elementwise", "fused_elementwise",
          "Megatron/TE's fused norm, SwiGLU, RoPE and residual-add kernels (default on); "
          "--no-fused-elementwise: PyTorch eager without torch.compile (torchtitan's Llama "
          "op by op: RMSNorm in fp32, silu then mul, complex RoPE in fp32); not with fp8"),
    _off("--eager-elementwise", "fused_elementwise", "--no-fused-elementwise"),
    _both("--untie-embeddings-and-output-weights", "untie_embeddings_and_output_weights",
          "an output layer of its own (default off: tied to the word embedding)"),
    _both("--add-bias-linear", "add_bias_linear", "biases in the linear layers (default on)"),
    _off("--disable-bias-linear", "add_bias_linear", "Megatron's spelling of "
         "--no-add-bias-linear"),
    _flag("--normalization", "normalization", "default LayerNorm",
          choices=NORMALIZATIONS),
    _flag("--position-embedding-type", "position_embedding_type",
          "default learned_absolute", choices=POSITION_EMBEDDINGS),
    _flag("--lora-rank --lora-dim", "lora_rank",
          "LoRA fine-tuning with adapters of rank r (NeMo's dim, PEFT's r): the base weights "
          "frozen, only the adapters train, reduce and keep optimizer states", type=int,
          metavar="R"),
    _flag("--lora-target-modules", "lora_target_modules",
          f"with --lora-rank: the linear layers that get adapters, comma-separated, NeMo's "
          f"names ({','.join(NEMO_TARGETS)}: the default) or PEFT's Llama names "
          f"({','.join(PEFT_TARGETS)})", type=_names, metavar="LIST"),
    _flag("--lora-base-dtype --qlora", "lora_base_dtype",
          "with --lora-rank: QLoRA, the frozen linear weights stored in bitsandbytes' "
          "nf4 or fp4 (4 bits, an absmax per 64) or int8 (LLM.int8(), an fp32 absmax per "
          "row) and dequantized before each GEMM", choices=list(BASE_DTYPES)),
    _both("--double-quant", "lora_double_quant",
          "with a 4-bit --lora-base-dtype: QLoRA's double quantization of the block scales "
          "(8-bit, 0.127 bits per weight instead of 0.5; default on)"),
)
REQUIRED_MODEL_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                         "vocab_size")
"""What a model without a preset must be given: Megatron-LM has no default for these (its
vocabulary comes from the tokenizer, its sequence length must be set)."""

PARALLEL_FLAGS = (  # ParallelConfig fields (pp's default depends on the command)
    _flag("--pp --pipeline-model-parallel-size", "pp", type=int),
    _flag("--vpp --virtual-pipeline-model-parallel-size", "vpp",
          "model chunks (virtual stages) per rank (default: the schedule's: "
          + ", ".join(f"{e.name} {e.default_vpp}" for e in SCHEDULES.values()) + ")",
          type=int),
    _flag("--num-layers-per-virtual-pipeline-stage", "layers_per_virtual_stage",
          "Megatron's other spelling of --vpp: vpp = num_layers / (pp * this)", type=int),
    _flag("--dp --data-parallel-size", "dp", "data-parallel ranks (default 1)", type=int),
    _flag("--tp --tensor-model-parallel-size", "tp", "tensor-parallel ranks (default 1)",
          type=int),
    _flag("--tp-mode", "tp_mode", "1d (default: Megatron's column- and row-parallel "
          "layers), 2d (Optimus: SUMMA on a q x q grid of the tp ranks, tp = q^2), 2.5d "
          "(Tesseract: --tp-depth d such grids, tp = d q^2) or 3d (Colossal-AI's 3D, "
          "tp = q^3); schedules/tp_grid.py", choices=["1d", "2d", "2.5d", "3d"]),
    _flag("--tp-depth", "tp_depth", "the depth d of --tp-mode 2.5d's grid (>= 2)", type=int),
    _flag("--cp --context-parallel-size", "cp",
          "context-parallel ranks (the sequence split over them; default 1)", type=int),
    _flag("--ep --expert-model-parallel-size", "ep",
          "expert-parallel ranks (MoE models; folds into dp * cp; default 1)", type=int),
    _flag("--etp --expert-tensor-parallel-size", "expert_tensor_parallel",
          "expert tensor-parallel ranks: each MoE expert split over them (default tp; "
          "etp * ep must divide tp * cp * dp)", type=int),
    _switch("--sequence-parallel", "sequence_parallel",
            "Megatron sequence parallelism (activations split by tp)"),
    _flag("--microbatches --num-microbatches", "num_microbatches",
          f"microbatches per iteration (default {DEFAULT_MICROBATCHES}, or global-batch-size "
          f"/ (micro-batch-size * dp))", type=int),
    _flag("--global-batch-size", "global_batch_size", type=int),
    _flag("--rank-order --order", "rank_order",
          "how the parallel grid maps to GPU indices, innermost first (default Megatron's "
          "tp-cp-ep-dp-pp)"),
    _flag("--first-stage-layers --decoder-first-pipeline-num-layers", "first_stage_layers",
          "layers on the first pipeline rank (the rest split evenly; default: an even split)",
          type=int),
    _flag("--last-stage-layers --decoder-last-pipeline-num-layers", "last_stage_layers",
          "layers on the last pipeline rank, which also runs the output layer and the loss",
          type=int),
    _switch("--account-for-embedding --account-for-embedding-in-pipeline-split",
            "account_for_embedding", "count the embedding as one layer when splitting the "
            "pipeline"),
    _switch("--account-for-loss --account-for-loss-in-pipeline-split", "account_for_loss",
            "count the output layer and loss as one layer when splitting"),
)

SHARDING_FLAGS = (  # ZeRO/FSDP, offload, ZeRO++, buckets, recompute: schedules.sharding
    _flag("--zero --zero-stage", "zero_stage",
          "ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters", type=int,
          choices=range(4)),
    _flag("--dp-impl", "dp_impl", "ddp (default: one process per GPU, DDP or ZeRO) or "
          "dataparallel (single-process torch.nn.DataParallel on one host: parameters "
          "broadcast from GPU 0 every forward, gradients reduced to it; "
          "schedules/single_process_dp.py)", choices=["ddp", "dataparallel"]),
    _flag("--fsdp", "fsdp", "full = ZeRO-3 over all dp ranks; hybrid = shard inside a node "
          "(--shard-size), replicate across nodes", choices=FSDP),
    _flag("--shard-size", "shard_size", "hybrid shard group (default: the dp ranks on one "
          "node)", type=int),
    _switch("--use-distributed-optimizer", "use_distributed_optimizer",
            "Megatron's distributed optimizer (= --zero 1)"),
    _flag("--data-parallel-sharding-strategy", "data_parallel_sharding_strategy",
          "Megatron-FSDP spelling of ZeRO 0/1/2/3",
          choices=["no_shard", "optim", "optim_grads", "optim_grads_params"]),
    _switch("--offload --optimizer-cpu-offload", "offload",
            "ZeRO-Offload: optimizer state and step on the host"),
    _flag("--offload-device", "offload_device",
          "with --offload: where the optimizer states live, host memory (cpu, default) or "
          "the node's NVMe (nvme: ZeRO-Infinity, ZeRO-3 only; simulate needs "
          "--nvme-bandwidth)", choices=list(OFFLOAD_DEVICES)),
    _flag("--nvme-bandwidth", "nvme_bandwidth_gbps",
          "with --offload-device nvme: the node's NVMe bandwidth in GB/s, read and write "
          "alike, shared by its GPUs (no datasheet gives it: measure it, e.g. with "
          "DeepSpeed's ds_nvme_tune)", type=float, metavar="GB/s"),
    _flag("--activation-memory-limit", "activation_memory_limit_gb",
          "with --schedule zb-auto: the activation memory in GB a pipeline rank may hold, "
          "the cap its schedule is built under (default: the device memory left after "
          "parameters, gradients, optimizer states and buffers)", type=float, metavar="GB"),
    _flag("--bucket-mb", "bucket_cap_mb",
          "gradient bucket in MiB (torch DDP bucket_cap_mb; default 25)", type=float,
          metavar="MiB"),
    _switch("--overlap-param-gather", "overlap_param_gather",
            "ZeRO-1/2: all-gather the updated parameters during the next iteration's "
            "forward, each layer group's before it runs (Megatron's --overlap-param-gather)"),
    _off("--no-overlap-grad-reduce", "overlap_grad_reduce",
         "reduce gradients after the backward instead of during it"),
    _switch("--overlap-grad-reduce", "overlap_grad_reduce",
            "reduce gradients in buckets during the backward (the default here; Megatron-LM's "
            "flag, off by default there)"),
    _flag("--ddp-bucket-size", "ddp_bucket_size",
          "Megatron's gradient bucket in parameters (2 bytes each; --bucket-mb in MiB)",
          type=int, metavar="PARAMS"),
    _off("--no-reshard-after-forward", "reshard_after_forward",
         "ZeRO-3/FSDP: keep gathered parameters from forward to backward"),
    _switch("--quantized-weights", "quantized_weights",
            "ZeRO++ qwZ: int8 parameter all-gather (ZeRO-3)"),
    _switch("--hpz", "hpz", "ZeRO++ hpZ: secondary parameter shard inside the node (ZeRO-3)"),
    _flag("--hpz-partition-size", "hpz_partition_size",
          "hpZ secondary shard size (default: the dp ranks on one node)", type=int),
    _switch("--quantized-gradients", "quantized_gradients",
            "ZeRO++ qgZ: int4 gradient reduce-scatter (ZeRO-2/3)"),
    _flag("--recompute", "recompute", "activation recompute (default none)",
          choices=RECOMPUTE),
    _flag("--recompute-granularity", "recompute_granularity",
          "Megatron spelling of --recompute", choices=["selective", "full"]),
    _switch("--recompute-activations", "recompute_activations",
            "Megatron spelling of --recompute selective"),
    _flag("--recompute-method", "recompute_method",
          "with full recompute: 'uniform' (default) checkpoints chunks of "
          "--recompute-num-layers layers and recomputes every layer; 'block' checkpoints and "
          "recomputes only the first --recompute-num-layers layers of each stage",
          choices=list(RECOMPUTE_METHODS)),
    _flag("--recompute-num-layers", "recompute_num_layers",
          "with full recompute: layers per checkpoint (uniform) or checkpointed layers per "
          "stage (block); default 1", type=int),
    _switch("--partition-activations --distribute-saved-activations", "partition_activations",
            "ZeRO-R Pa (DeepSpeed's partition_activations): with --recompute full and tp > 1 "
            "(no --sequence-parallel), each TP rank keeps 1/tp of every checkpoint and the "
            "backward all-gathers it over tp before recomputing"),
    _switch("--cpu-checkpointing", "cpu_checkpointing",
            "ZeRO-R Pa+cpu (DeepSpeed's cpu_checkpointing): the partitioned checkpoints live in "
            "host memory; each forward copies them to the host and each backward back, over "
            "PCIe, blocking"),
)

INTRA_LAYER_FLAGS = (  # how TP/CP/EP communication runs: schedules.intra_layer
    _switch("--tp-comm-overlap", "tp_comm_overlap",
            "Megatron --tp-comm-overlap: TP collectives run alongside the GEMMs instead of "
            "between them"),
    _flag("--cp-comm", "cp_comm", "context parallelism: ring attention (KV passed around the "
          "ring, overlapped; default), DeepSpeed-Ulysses all-to-alls, or USP (Ulysses inside "
          "--cp-a2a ranks, a ring across; schedules/usp.py)", choices=CP_COMM),
    _flag("--cp-comm-type", "cp_comm_type",
          "Megatron-Core spelling of --cp-comm: p2p = ring, a2a = ulysses, a2a+p2p = usp",
          choices=["p2p", "a2a", "a2a+p2p"]),
    _flag("--cp-a2a", "cp_a2a", "with --cp-comm usp: the Ulysses ranks of each ring step "
          "(divides --cp)", type=int),
    _flag("--hierarchical-context-parallel-sizes", "hierarchical_context_parallel_sizes",
          "Megatron-Core spelling for USP: A R = the Ulysses (a2a) and ring (p2p) ranks; "
          "cp = A * R", type=int, nargs=2, metavar=("A", "R")),
    _flag("--moe-imbalance", "moe_imbalance",
          "busiest expert's tokens over the balanced share (>= 1; default 1)", type=float,
          metavar="FACTOR"),
    _switch("--scatter-gather-tensors-in-pipeline", "scatter_gather",
            "SC21's scatter/gather: each TP rank sends 1/tp of a pipeline transfer, the "
            "receivers all-gather it (tp > 1, no SP)"),
)

COST_FLAGS = (  # the cost model: sim.cost_model
    _flag("--uniform-costs", "uniform_costs",
          "fixed seconds per forward/backward of one virtual stage on one microbatch; "
          "communication then costs zero", metavar="F,B"),
    _flag("--compute-efficiency", "compute_efficiency",
          "fraction of dense peak FLOP/s every GEMM reaches on every device (default: the "
          "device's measured matmul ceiling for the dtype x the attainment factor, "
          "sim.cost)", type=float),
    _flag("--memory-efficiency", "memory_efficiency",
          "fraction of HBM bandwidth every memory-bound kernel reaches (default: the "
          "device's measured HBM ceiling x the attainment factor)", type=float),
    _flag("--profile", "profile", "measured compute and P2P times from `clustersim calibrate` "
          "instead of the roofline (the topology then only places ranks)", metavar="PATH"),
    _flag("--gemm-table", "gemm_table", "a `clustersim calibrate` profile whose measured GEMM "
          "times (its gemm section, interpolated between shapes) and flash-attention times "
          "(its attention section, at its sequence length) replace the roofline's compute "
          "term for those kernels; other kernels and the network stay as they are",
          metavar="PATH"),
    _flag("--attention-backend", "attention_backend",
          "whose published flash-attention speed prices the attention kernels (Megatron-LM's "
          "spellings): fused = cuDNN (Transformer Engine's FusedAttention), flash = "
          "FlashAttention-2 (flash-attn, PyTorch SDPA's flash backend), auto = Transformer "
          "Engine's choice (fused on Hopper and Blackwell, flash on Ampere; default); "
          "topologies/attention_kernels.py", choices=BACKENDS),
)

SCHEDULE_FLAG = _flag("--schedule", "schedule", f"{', '.join(SCHEDULES)} (default "
                      f"{DEFAULT_SCHEDULE}; aliases such as torch's class names accepted): "
                      f"{schedule_help()}")


def flag(field: str) -> Flag:
    """The table's flag that sets `field`."""
    return next(f for f in (*PARALLEL_FLAGS, *SHARDING_FLAGS, *INTRA_LAYER_FLAGS,
                            *MODEL_FLAGS, *COST_FLAGS) if f.field == field)


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "model (a preset, optionally overridden by Megatron-named dims; dims without a "
        "preset take Megatron-LM's defaults)")
    g.add_argument("--model", help=f"model preset; see `clustersim models` (default "
                                   f"{DEFAULT_MODEL} when no model flag is given)")
    for flag in MODEL_FLAGS:
        flag.add_to(g)


def add_parallel_flags(parser: argparse.ArgumentParser, with_schedule: bool = True,
                       pp_default: int = DEFAULT_PP) -> None:
    """The parallel and sharding flags (and --schedule, --max-ops). A flag not given stays
    None, so a schedule given as data can tell a conflicting flag from a default (the
    defaults apply in parallel_from_args: pp `pp_default`, DEFAULT_SCHEDULE)."""
    g = parser.add_argument_group("parallelism (Megatron spellings accepted)")
    if with_schedule:
        SCHEDULE_FLAG.add_to(g)
    for flag in PARALLEL_FLAGS:
        if flag.field == "pp":  # its default is the command's
            flag = dataclasses.replace(flag, help=f"pipeline stages (default {pp_default})")
        flag.add_to(g)
    parser.set_defaults(pp_default=pp_default)
    parser.add_argument("--megatron-defaults", action="store_true", help=argparse.SUPPRESS)
    add_limit_flags(parser)
    g = parser.add_argument_group("data-parallel sharding and recompute "
                                  "(DeepSpeed/Megatron/FSDP spellings accepted)")
    for flag in SHARDING_FLAGS:
        flag.add_to(g)


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """--max-ops: the op budget checked before a schedule is built (schedules.limits)."""
    parser.add_argument("--max-ops", type=int, default=MAX_OPS, metavar="N",
                        help=f"refuse a schedule of more than about N ops per iteration "
                             f"before building it (default {MAX_OPS:,}, about a minute of "
                             f"replay)")


def max_ops_from_args(args: argparse.Namespace) -> int:
    require_positive_int("--max-ops", args.max_ops)
    return args.max_ops


def add_intra_layer_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("intra-layer communication (TP, CP, EP)")
    for flag in INTRA_LAYER_FLAGS:
        flag.add_to(g)


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("cluster and costs")
    g.add_argument("--topology", default=DEFAULT_TOPOLOGY,
                   help=f"preset name or topology JSON file (default {DEFAULT_TOPOLOGY})")
    for flag in COST_FLAGS:
        flag.add_to(g)


def given(args: argparse.Namespace, flags: Sequence[Flag]) -> dict[str, Any]:
    """{field: value} of the `flags` given on the command line (absent ones are None, or
    not parsed at all by this command)."""
    values = {flag.field: getattr(args, flag.field, None) for flag in flags}
    return {field: value for field, value in values.items() if value is not None}


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    """The preset `--model`, its fields overridden by the model flags given; model flags
    without --model: a model of Megatron-LM's argument defaults (ModelSpec's) with those
    fields; no model flag at all: DEFAULT_MODEL."""
    dims = given(args, MODEL_FLAGS)
    grouped = dims.pop("group_query_attention", False)
    if args.model is not None or not dims:
        model = get_model(args.model or DEFAULT_MODEL, **dims)
    else:
        missing = [flag.names[0] for flag in MODEL_FLAGS
                   if flag.field in REQUIRED_MODEL_FIELDS and flag.field not in dims]
        if missing:
            raise ConfigError(f"model dimensions without --model take Megatron-LM's defaults, "
                              f"which have no value for {', '.join(missing)}: give them, or a "
                              f"preset with --model")
        model = ModelSpec(**dims)
    if grouped and model.num_query_groups == model.num_attention_heads:
        raise ConfigError("--group-query-attention with one KV group per head changes "
                          "nothing: give --num-query-groups")
    return model


def parallel_from_args(args: argparse.Namespace, schedule: str | None,
                       vpp: int | None = None, micro_batch_size: int = 1,
                       without: Collection[str] = (),
                       num_layers: int | None = None) -> ParallelConfig:
    """The ParallelConfig of the parallel, sharding and intra-layer flags, for `schedule`
    (CUSTOM_SCHEDULE for a schedule given as data; vpp: `vpp`, --vpp, or the schedule's
    default; Megatron's --num-layers-per-virtual-pipeline-stage N gives vpp =
    num_layers / (pp N) of a model of `num_layers`), leaving out the flags whose fields
    are named in `without`. Microbatches default to DEFAULT_MICROBATCHES when neither they
    nor the global batch size are given."""
    values = {k: v for k, v in given(args, PARALLEL_FLAGS + SHARDING_FLAGS
                                           + INTRA_LAYER_FLAGS).items() if k not in without}
    values.setdefault("pp", getattr(args, "pp_default", DEFAULT_PP))
    schedule = schedule or DEFAULT_SCHEDULE
    per_chunk = values.pop("layers_per_virtual_stage", None)
    if per_chunk is not None:
        vpp = vpp_from_layers(per_chunk, values, vpp, num_layers)
    if vpp is not None:
        values["vpp"] = vpp
    if "num_microbatches" not in values and "global_batch_size" not in values:
        values["num_microbatches"] = DEFAULT_MICROBATCHES
    config = ParallelConfig.from_kwargs(schedule=schedule, micro_batch_size=micro_batch_size,
                                        **values)
    if (getattr(args, "megatron_defaults", False) and "overlap_grad_reduce" not in values
            and moves_gradients(config) and config.zero_stage < 3):
        config = replace(config, overlap_grad_reduce=False)  # Megatron's default
    return config


def vpp_from_layers(per_chunk: int, values: dict[str, Any], vpp: int | None,
                    num_layers: int | None) -> int:
    """vpp from Megatron's --num-layers-per-virtual-pipeline-stage (per_chunk layers in
    each model chunk): num_layers / (pp per_chunk), as Megatron computes it."""
    require_positive_int("--num-layers-per-virtual-pipeline-stage", per_chunk)
    if vpp is not None or "vpp" in values:
        raise ConfigError("--num-layers-per-virtual-pipeline-stage and --vpp both set the "
                          "model chunks per rank: give one")
    if num_layers is None:
        raise ConfigError("--num-layers-per-virtual-pipeline-stage needs the model's layers: "
                          "this command has no model")
    pp = values["pp"]
    if num_layers % (pp * per_chunk):
        raise ConfigError(f"--num-layers-per-virtual-pipeline-stage {per_chunk}: num_layers="
                          f"{num_layers} is not divisible by pp * {per_chunk} = "
                          f"{pp * per_chunk}")
    return num_layers // (pp * per_chunk)


def cost_model_from_args(args: argparse.Namespace) -> CostModel:
    """The cost model the cost flags choose (sim.cost_model): uniform F,B seconds, a
    measured profile, or the roofline at the given (or default) efficiencies."""
    values = given(args, COST_FLAGS)
    efficiencies = {k: v for k, v in values.items() if k.endswith("_efficiency")}
    for refinement in ("gemm_table", "attention_backend"):
        if refinement in values and ("profile" in values or "uniform_costs" in values):
            raise ConfigError(f"{flag(refinement).names[0]} refines the roofline: --profile and "
                              f"--uniform-costs replace it; give one of them")
    if "profile" in values:
        if "uniform_costs" in values:
            raise ConfigError("--profile and --uniform-costs both set compute times: give one")
        return ProfileCostModel(Profile.load(values["profile"]),
                                **{k: v for k, v in efficiencies.items()
                                   if k == "memory_efficiency"})
    if "uniform_costs" in values:
        return parse_uniform_costs(values["uniform_costs"])
    table = Profile.load(values["gemm_table"]) if "gemm_table" in values else None
    return RooflineCostModel(**efficiencies, gemm_table=table,
                             attention_backend=values.get("attention_backend", "auto"))
