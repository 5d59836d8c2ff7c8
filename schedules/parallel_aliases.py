"""Other frameworks' spellings of ParallelConfig fields, and the values they map to.

A key is normalised before lookup: leading '--' stripped, '-' and '.' become '_', lower
case, so `--tensor-model-parallel-size`, `zero_optimization.stage` and
`zero_optimization.offload_optimizer.device` all resolve. A DeepSpeed key nested under
`zero_optimization` may also be given bare (`zero_quantized_weights`).

RENAMES change only the name. VALUE_ALIASES translate a value into field assignments;
the sources of each mapping:
- DeepSpeed config JSON (deepspeed/runtime/zero/config.py, offload_config.py):
  `zero_optimization.stage`, `offload_optimizer.device` ('cpu' -> offload; 'nvme' ->
  offload with offload_device 'nvme', ZeRO-Infinity; the mapping's `nvme_path`, `pin_memory`
  and `fast_init` change no modelled time or byte; `pipeline_read`/`pipeline_write`,
  `ratio` < 1 and a `buffer_count` other than 4 are refused as not modelled),
  `offload_param` (ZeRO-Infinity's parameter offload: refused, not modelled),
  `zero_quantized_weights` (qwZ), `zero_hpz_partition_size` (hpZ, on when > 1; the value
  is the secondary shard size), `zero_quantized_gradients` (qgZ), `reduce_bucket_size`
  (counted in ELEMENTS, default 5e8; converted to bytes assuming 16-bit gradients,
  2 bytes each, DeepSpeed's fp16/bf16 mixed-precision reduction);
  `activation_checkpointing.partition_activations` and `.cpu_checkpointing` (ZeRO-R's
  Pa and Pa+cpu; deepspeed.checkpointing.configure's `checkpoint_in_cpu`).
- Megatron-LM arguments.py: `--use-distributed-optimizer` (shards the optimizer state
  over data-parallel ranks, i.e. ZeRO-1), `--optimizer-cpu-offload`,
  `--recompute-granularity {full,selective}`, `--recompute-activations` (= selective),
  `--distribute-saved-activations` (= partition_activations), `--ddp-bucket-size`
  (Megatron-Core DistributedDataParallelConfig.bucket_size: PARAMETERS per bucket,
  converted to bytes at 2 per gradient, Megatron's default reduction in the 16-bit
  parameter dtype without --grad-reduce-in-bf16/fp32 flags)
  (`--recompute-method` and `--recompute-num-layers` are fields of their own names,
  schedules.recompute), and Megatron-FSDP's
  `--data-parallel-sharding-strategy {no_shard,optim,optim_grads,optim_grads_params}`
  = ZeRO 0/1/2/3.
- Megatron-LM / Megatron-Core arguments.py, intra-layer: `--expert-tensor-parallel-size`
  (default None = tp; torchtitan's `expert_tensor_parallel_degree`), `--tp-comm-overlap`
  (the field's own name), `--cp-comm-type` (nargs='+', one value per layer or one for
  all: 'p2p' = ring attention -> cp_comm 'ring', 'a2a' = Ulysses -> 'ulysses', 'a2a+p2p' =
  USP -> 'usp'; 'allgather' is not modelled), `--hierarchical-context-parallel-sizes A R`
  (USP: cp_a2a = A, cp = A * R), `--no-scatter-gather-tensors-in-pipeline` (dest
  `scatter_gather_tensors_in_pipeline`, Megatron's default True; here scatter_gather is
  False unless given: True, or the `no_` flag False, turns it on).
- Megatron-Core pipeline split: `--decoder-first-pipeline-num-layers`,
  `--decoder-last-pipeline-num-layers`, `--account-for-embedding-in-pipeline-split`,
  `--account-for-loss-in-pipeline-split` (schedules.pipeline_split).
- PyTorch: FSDP `sharding_strategy` (torch.distributed.fsdp.ShardingStrategy:
  NO_SHARD = DDP, SHARD_GRAD_OP = ZeRO-2, FULL_SHARD = ZeRO-3, HYBRID_SHARD = ZeRO-3
  inside a shard group, replicated across groups, _HYBRID_SHARD_ZERO2 = ZeRO-2 likewise),
  DDP `bucket_cap_mb` (MiB: torch multiplies by 1024 * 1024; default 25).
- clustersim's own `nvme_bandwidth_gbps` (--nvme-bandwidth, GB/s = 1e9 B/s per node; DeepSpeed
  has no such key) -> nvme_bandwidth in bytes/s; `activation_memory_limit_gb`
  (--activation-memory-limit, GB = 1e9 bytes per pipeline rank) -> activation_memory_limit.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from clustersim.user_files import is_finite_number

from .errors import ConfigError

# Megatron-LM / torchtitan / DeepSpeed names of fields (after normalisation).
RENAMES: dict[str, str] = {
    "pipeline_model_parallel_size": "pp", "pipeline_parallel_degree": "pp",
    "virtual_pipeline_model_parallel_size": "vpp",
    "tensor_model_parallel_size": "tp", "tensor_parallel_degree": "tp",
    "data_parallel_size": "dp", "data_parallel_replicate_degree": "dp",
    "context_parallel_size": "cp", "context_parallel_degree": "cp",
    "expert_model_parallel_size": "ep", "expert_parallel_degree": "ep",
    "expert_tensor_parallel_size": "expert_tensor_parallel",
    "expert_tensor_parallel_degree": "expert_tensor_parallel",
    "etp": "expert_tensor_parallel",
    "decoder_first_pipeline_num_layers": "first_stage_layers",
    "decoder_last_pipeline_num_layers": "last_stage_layers",
    "account_for_embedding_in_pipeline_split": "account_for_embedding",
    "account_for_loss_in_pipeline_split": "account_for_loss",
    "scatter_gather_tensors_in_pipeline": "scatter_gather",
    "num_micro_batches": "num_microbatches", "microbatches": "num_microbatches",
    "pipeline_parallel_microbatches": "num_microbatches",
    "train_batch_size": "global_batch_size",
    "train_micro_batch_size_per_gpu": "micro_batch_size",
    "zero_optimization_stage": "zero_stage", "zero": "zero_stage",
    "pipeline_parallel_schedule": "schedule",
    "order": "rank_order",
    "zero_quantized_weights": "quantized_weights",
    "zero_quantized_gradients": "quantized_gradients",
    "overlap_comm": "overlap_grad_reduce",
    "activation_checkpointing_partition_activations": "partition_activations",
    "activation_checkpointing_cpu_checkpointing": "cpu_checkpointing",
    "checkpoint_in_cpu": "cpu_checkpointing",
    "distribute_saved_activations": "partition_activations",
}

DEEPSPEED_GRAD_BYTES = 2  # reduce_bucket_size counts elements of 16-bit gradients
MEGATRON_GRAD_BYTES = 2  # --ddp-bucket-size counts parameters, reduced in 16 bits
MIB = 1024 * 1024
MAX_BUCKET_BYTES = 1 << 40  # a gradient bucket above 1 TiB is a typo
GB = 10**9  # --nvme-bandwidth is in GB/s
MAX_NVME_BANDWIDTH = 10**13  # bytes/s: a node's NVMe above 10 TB/s is a typo
MAX_ACTIVATION_LIMIT = 10**15  # bytes: a GPU's activations above 1 PB are a typo

SHARDING_STRATEGIES = {  # Megatron-FSDP --data-parallel-sharding-strategy
    "no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
FSDP_STRATEGIES = {  # torch.distributed.fsdp.ShardingStrategy -> (zero_stage, fsdp)
    "no_shard": (0, "none"), "shard_grad_op": (2, "none"), "full_shard": (3, "full"),
    "hybrid_shard": (3, "hybrid"), "_hybrid_shard_zero2": (2, "hybrid")}
CP_COMM_TYPES = {"p2p": "ring", "a2a": "ulysses", "a2a+p2p": "usp"}  # --cp-comm-type


def _choice(key: str, value: Any, table: Mapping[str, Any]) -> Any:
    name = str(getattr(value, "name", value)).strip().lower()  # enum members too
    name = name.rsplit(".", 1)[-1]  # 'ShardingStrategy.FULL_SHARD'
    if name not in table:
        raise ConfigError(f"{key}={value!r} must be one of {', '.join(table)}")
    return table[name]


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be a bool, got {value!r}")
    return value


OFFLOAD_OPTIMIZER_KEYS = {"device", "nvme_path", "pin_memory", "fast_init"}
"""Keys of DeepSpeed's offload_optimizer accepted as given: none changes a modelled time or
byte (nvme_path is where the swap files go; pin_memory and fast_init are not modelled)."""
OFFLOAD_OPTIMIZER_DEFAULTS = {  # DeepSpeedZeroOffloadOptimizerConfig: key -> (default, why)
    "pipeline_read": (False, "the pipelined swapper (overlapping the next tile's read with "
                             "this tile's step) is not modelled"),
    "pipeline_write": (False, "the pipelined swapper (overlapping the previous tile's write "
                              "with this tile's step) is not modelled"),
    "ratio": (1.0, "partial offload (part of the states stepped on the GPU) is not modelled"),
    "buffer_count": (4, "the pinned NVMe staging buffers are counted at DeepSpeed's default 4"),
}


def _offload(key: str, value: Any) -> dict[str, Any]:
    """DeepSpeed's offload_optimizer: a device name, a bool, or its config mapping."""
    if isinstance(value, Mapping):  # DeepSpeed's {"device": "nvme", "nvme_path": ...}
        known = OFFLOAD_OPTIMIZER_KEYS | set(OFFLOAD_OPTIMIZER_DEFAULTS)
        for name in sorted(set(value) - OFFLOAD_OPTIMIZER_KEYS):
            if name not in known:
                raise ConfigError(f"{key}: unknown key {name!r}; DeepSpeed's are "
                                  f"{', '.join(sorted(known))}")
            default, why = OFFLOAD_OPTIMIZER_DEFAULTS[name]
            if value[name] != default:
                raise ConfigError(f"{key}.{name}={value[name]!r}: {why} (DeepSpeed's default "
                                  f"{default!r} is)")
        value = value.get("device", "none")
    if isinstance(value, bool):
        return {"offload": value}
    device = str(value).strip().lower()
    if device not in ("cpu", "nvme", "none"):
        raise ConfigError(f"{key}: device must be 'cpu', 'nvme' or 'none', got {value!r}")
    if device == "nvme":
        return {"offload": True, "offload_device": "nvme"}
    return {"offload": device == "cpu"}


def _offload_param(key: str, value: Any) -> dict[str, Any]:
    """DeepSpeed's offload_param: only device 'none' (the default) is modelled."""
    device = value.get("device", "none") if isinstance(value, Mapping) else value
    if str(device).strip().lower() != "none":
        raise ConfigError(f"{key}: device {device!r} is not modelled: ZeRO-Infinity's "
                          f"parameter offload (ZeRO-3's 16-bit parameters kept on the host or "
                          f"NVMe, fetched before each use) is a feature apart from "
                          f"offload_optimizer, which is modelled")
    return {}


def _hpz(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be an integer >= 1 (1 = hpZ off), got {value!r}")
    return {"hpz": True, "hpz_partition_size": value} if value > 1 else {"hpz": False}


def _bytes_from(key: str, value: Any, scale: float, limit: float = MAX_BUCKET_BYTES,
                what: str = "1 TiB of gradients") -> int:
    """`value` x `scale` as an int, or ConfigError unless 0 < value x scale <= `limit`."""
    if not is_finite_number(value) or not value > 0 or value * scale > limit:
        raise ConfigError(f"{key} must be a finite number > 0 of at most "
                          f"{limit / scale:,.0f} ({what}), got {value!r}")
    return int(value * scale)


def _cp_comm_type(key: str, value: Any) -> dict[str, Any]:
    """Megatron-Core's --cp-comm-type: a value, or a list of one value per layer."""
    values = {value} if isinstance(value, str) else set(value)
    if len(values) != 1:
        raise ConfigError(f"{key}={value!r}: one communication type for every layer is "
                          f"modelled, not one per layer")
    (name,) = values
    if str(name).strip().lower() == "allgather":
        raise ConfigError(f"{key}={value!r}: 'allgather' context parallelism is not "
                          f"modelled; use one of {', '.join(CP_COMM_TYPES)}")
    return {"cp_comm": _choice(key, name, CP_COMM_TYPES)}


def _hierarchical_cp(key: str, value: Any) -> dict[str, Any]:
    """Megatron-Core's --hierarchical-context-parallel-sizes A R (a2a+p2p): cp_a2a = A and
    cp = A * R."""
    sizes = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(sizes) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                  for v in sizes):
        raise ConfigError(f"{key}={value!r}: two positive integers, the Ulysses (a2a) ranks "
                          f"and the ring (p2p) ranks of USP context parallelism")
    return {"cp_a2a": sizes[0], "cp": sizes[0] * sizes[1]}


VALUE_ALIASES: dict[str, Callable[[str, Any], dict[str, Any]]] = {
    "use_distributed_optimizer":
        lambda k, v: {"zero_stage": 1} if _flag(k, v) else {},
    "data_parallel_sharding_strategy":
        lambda k, v: {"zero_stage": _choice(k, v, SHARDING_STRATEGIES)},
    "sharding_strategy":
        lambda k, v: dict(zip(("zero_stage", "fsdp"), _choice(k, v, FSDP_STRATEGIES))),
    "offload_optimizer": _offload, "offload_optimizer_device": _offload,
    "offload_param": _offload_param, "offload_param_device": _offload_param,
    "nvme_bandwidth_gbps":
        lambda k, v: {"nvme_bandwidth": _bytes_from(k, v, GB, MAX_NVME_BANDWIDTH,
                                                     "10 TB/s of NVMe per node")},
    "activation_memory_limit_gb":
        lambda k, v: {"activation_memory_limit": _bytes_from(k, v, GB, MAX_ACTIVATION_LIMIT,
                                                             "1 PB of activations per GPU")},
    "optimizer_cpu_offload": lambda k, v: {"offload": _flag(k, v)},
    "zero_hpz_partition_size": _hpz,
    "bucket_cap_mb": lambda k, v: {"bucket_bytes": _bytes_from(k, v, MIB)},
    "reduce_bucket_size":
        lambda k, v: {"bucket_bytes": _bytes_from(k, v, DEEPSPEED_GRAD_BYTES)},
    "ddp_bucket_size":
        lambda k, v: {"bucket_bytes": _bytes_from(k, v, MEGATRON_GRAD_BYTES)},
    "recompute_granularity":
        lambda k, v: {"recompute": _choice(k, v, {"full": "full", "selective": "selective",
                                                  "none": "none"})},
    "recompute_activations": lambda k, v: {"recompute": "selective"} if _flag(k, v) else {},
    "cp_comm_type": _cp_comm_type,
    "hierarchical_context_parallel_sizes": _hierarchical_cp,
    "no_scatter_gather_tensors_in_pipeline": lambda k, v: {"scatter_gather": not _flag(k, v)},
}

ALIASES: dict[str, str] = {**RENAMES, **{k: k for k in VALUE_ALIASES}}


def normalise_key(key: str) -> str:
    """'--Zero-Optimization.Stage' -> 'zero_optimization_stage'."""
    return key.lstrip("-").replace("-", "_").replace(".", "_").lower()


def resolve_kwargs(kw: Mapping[str, Any], known: set[str]) -> dict[str, Any]:
    """Field values from keyword arguments in any supported spelling. None means 'not
    given'. A field set twice is an error naming both spellings, except that value
    aliases may agree (`--use-distributed-optimizer` with
    `--data-parallel-sharding-strategy optim`)."""
    values: dict[str, Any] = {}
    spelled: dict[str, tuple[str, bool]] = {}  # field -> (spelling, came from a value alias)
    for key, value in kw.items():
        norm = normalise_key(key)
        if norm not in known and norm not in ALIASES and norm.startswith("zero_optimization_"):
            norm = norm[len("zero_optimization_"):]
        if norm in VALUE_ALIASES:
            if value is None:
                continue
            assignments, derived = VALUE_ALIASES[norm](key, value), True
        else:
            name = RENAMES.get(norm, norm)
            if name not in known:
                raise ConfigError(f"unknown parallel option {key!r}: use one of "
                                  f"{', '.join(sorted(known | set(ALIASES)))}")
            if value is None:
                continue
            assignments, derived = {name: value}, False
        for name, new in assignments.items():
            if name in values:
                old_key, old_derived = spelled[name]
                if not (derived and old_derived and values[name] == new):
                    raise ConfigError(f"{name} given twice, as {old_key}={kw[old_key]!r} "
                                      f"and {key}={value!r}")
            values[name], spelled[name] = new, (key, derived)
    return values
