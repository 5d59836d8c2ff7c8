"""A DeepSpeed config JSON (`--deepspeed-config ds.json`) as this CLI's flags
(sim.cli.config_files). Keys and defaults: DeepSpeed's runtime/config.py,
runtime/zero/config.py and offload_config.py (docs: deepspeed.ai/docs/config-json).

Translated: `train_batch_size` (--global-batch-size), `train_micro_batch_size_per_gpu`
(--micro-batch-size), `gradient_accumulation_steps` (--microbatches: DeepSpeed's
micro-batches per step on each rank), `bf16.enabled` / `fp16.enabled` (the dtype; neither:
DeepSpeed trains in fp32), `zero_optimization.stage`, `.offload_optimizer`,
`.reduce_bucket_size` (elements of 16-bit gradients), `.overlap_comm`, ZeRO++'s
`.zero_quantized_weights`, `.zero_hpz_partition_size`, `.zero_quantized_gradients`
(schedules.parallel_aliases reads each), `activation_checkpointing.partition_activations`
and `.cpu_checkpointing`. Accepted and listed as ignored: keys that change no modelled time
or byte (optimizer hyper-parameters, scheduler, logging, loss scaling, ...). Accepted and
listed as assumed: ZeRO tuning keys whose effect the model fixes (its own bucketing and
prefetch). Refused: an optimizer other than Adam/AdamW, parameter offload, and any key
DeepSpeed does not have (an error naming the key and the file).
"""
from __future__ import annotations

from typing import Any

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.parallel_aliases import DEEPSPEED_GRAD_BYTES, MIB, VALUE_ALIASES

from .config_reading import Settings, read_mapping

IGNORED_SECTIONS = {  # whole sections (and their keys): no modelled time or byte
    "scheduler", "tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler",
    "comms_logger", "aio", "autotuning", "elasticity", "checkpoint", "data_efficiency",
    "curriculum_learning", "compression_training", "monitor_config", "timers"}
IGNORED_KEYS = {
    "steps_per_print", "wall_clock_breakdown", "dump_state", "gradient_clipping",
    "prescale_gradients", "gradient_predivide_factor", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "memory_breakdown", "sparse_gradients",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
    "optimizer.params.weight_decay", "optimizer.params.torch_adam",
    "optimizer.params.adam_w_mode", "fp16.loss_scale", "fp16.initial_scale_power",
    "fp16.loss_scale_window", "fp16.hysteresis", "fp16.min_loss_scale",
    "fp16.consecutive_hysteresis", "fp16.auto_cast", "bf16.immediate_grad_update",
    "zero_optimization.contiguous_gradients", "zero_optimization.load_from_fp32_weights",
    "zero_optimization.elastic_checkpoint", "zero_optimization.ignore_unused_parameters",
    "zero_optimization.round_robin_gradients",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.gather_16bit_weights_on_model_save",
    "activation_checkpointing.contiguous_memory_optimization",
    "activation_checkpointing.number_checkpoints",
    "activation_checkpointing.synchronize_checkpoint_boundary",
    "activation_checkpointing.profile"}
ASSUMED_KEYS = {  # key -> what the model does instead
    "zero_optimization.allgather_partitions": "parameters gathered in buckets",
    "zero_optimization.allgather_bucket_size": "clustersim's own parameter buckets",
    "zero_optimization.reduce_scatter": "gradients reduce-scattered under ZeRO-2/3",
    "zero_optimization.sub_group_size": "the optimizer step of a whole shard",
    "zero_optimization.stage3_prefetch_bucket_size": "one layer unit prefetched",
    "zero_optimization.stage3_param_persistence_threshold": "every parameter sharded",
    "zero_optimization.stage3_max_live_parameters": "one layer unit prefetched",
    "zero_optimization.stage3_max_reuse_distance": "gathered again for the backward",
    "zero_optimization.prefetch_bucket_size": "one layer unit prefetched",
    "zero_optimization.param_persistence_threshold": "every parameter sharded",
    "zero_optimization.max_live_parameters": "one layer unit prefetched",
    "zero_optimization.max_reuse_distance": "gathered again for the backward",
}
SWITCHES = {  # key -> this CLI's dest, a bool
    "zero_optimization.overlap_comm": "overlap_grad_reduce",
    "zero_optimization.zero_quantized_weights": "quantized_weights",
    "zero_optimization.zero_quantized_gradients": "quantized_gradients",
    "activation_checkpointing.partition_activations": "partition_activations",
    "activation_checkpointing.cpu_checkpointing": "cpu_checkpointing",
}
ADAM = {"adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam"}


def settings(path: str) -> tuple[Settings, list[str]]:
    """This CLI's settings for DeepSpeed config `path` (key -> {flag: value}), and the
    notes (module docstring)."""
    source = f"--deepspeed-config {path}"
    flat = _flatten(read_mapping(path, "--deepspeed-config"))
    out: Settings = []
    ignored, assumed = [], []
    dtype = "fp32"
    for key, value in flat.items():
        section = key.split(".")[0]
        if key in ("bf16.enabled", "fp16.enabled"):
            if _bool(source, key, value):
                dtype = section
        elif section in IGNORED_SECTIONS or key in IGNORED_KEYS:
            ignored.append(key)
        elif key in ASSUMED_KEYS:
            assumed.append(f"{key} ({ASSUMED_KEYS[key]})")
        elif key == "optimizer.type":
            if str(value).lower() not in ADAM:
                raise ConfigError(f"{source}: optimizer.type={value!r}: only Adam's states and "
                                  f"step are modelled")
        else:
            out.append((key, _translate(source, key, value)))
    out.insert(0, ("bf16.enabled / fp16.enabled", {"dtype": dtype}))
    notes = [f"{source}: dtype {dtype} (bf16.enabled / fp16.enabled; neither: fp32)"]
    if ignored:
        notes.append(f"{source}: ignored, no effect on a modelled time or byte: "
                     f"{', '.join(ignored)}")
    if assumed:
        notes.append(f"{source}: not modelled as set, assumed instead: {'; '.join(assumed)}")
    return out, notes


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; offload sections stay whole (their own reader)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and not name.endswith(("offload_optimizer",
                                                          "offload_param")):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _bool(source: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
    return value


def _translate(source: str, key: str, value: Any) -> dict[str, Any]:
    """The flags one key sets; ConfigError for a key DeepSpeed does not have."""
    scalars = {"train_batch_size": "global_batch_size",
               "train_micro_batch_size_per_gpu": "micro_batch_size",
               "gradient_accumulation_steps": "microbatches",
               "zero_optimization.stage": "zero"}
    try:
        if key in scalars:
            return {scalars[key]: value}
        if key in SWITCHES:
            return {SWITCHES[key]: _bool(source, key, value)}
        if key == "zero_optimization.reduce_bucket_size":
            VALUE_ALIASES["reduce_bucket_size"](key, value)  # its range check
            return {"bucket_mb": value * DEEPSPEED_GRAD_BYTES / MIB}
        if key.endswith(("offload_optimizer", "offload_param")):
            return VALUE_ALIASES[key.rsplit(".", 1)[-1]](key, value)
        if key == "zero_optimization.zero_hpz_partition_size":
            return VALUE_ALIASES["zero_hpz_partition_size"](key, value)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    raise ConfigError(f"{source}: unknown key {key!r}; rule: DeepSpeed's config keys "
                      f"(deepspeed.ai/docs/config-json) that this simulator reads or lists")
