"""A torchtitan job TOML (`--torchtitan-config job.toml`) as this CLI's flags
(sim.cli.config_files). Keys: torchtitan's JobConfig (torchtitan/config/job_config.py:
[model], [training], [parallelism], [activation_checkpoint], [compile], [float8]).

- Model: [model] name + flavor -> a preset ('llama3' + '8B' -> llama3-8b); 'float8' in
  model.converters -> dtype fp8, float8.enable_fsdp_float8_all_gather -> FP8 parameters.
  training.mixed_precision_param bfloat16 / float32 -> the dtype; training.seq_len.
- Batch: with pp > 1 a micro-batch is parallelism.pipeline_parallel_microbatch_size samples
  and training.local_batch_size (older: batch_size) the samples of one dp rank; without,
  the micro-batch is local_batch_size. training.global_batch_size > 0 adds gradient
  accumulation (global / (local dp) steps), -1 none.
- Parallelism: dp = data_parallel_replicate_degree * data_parallel_shard_degree; shard
  degree > 1 is FSDP2 (ZeRO-3), hybrid (shard inside, replicate across) when both are > 1;
  -1 (the GPUs left) is refused, as the file does not hold the world size. tp > 1 runs
  torchtitan's sequence-parallel TP plan (--sequence-parallel), async TP as
  --tp-comm-overlap (assumed); pipeline_parallel_schedule by torch's class names;
  pipeline_parallel_layers_per_stage -> layers per model chunk; cp, ep, etp.
- Recompute: activation_checkpoint.mode none / full / selective; selective with
  selective_ac_option 'op' is modelled as Megatron's selective recompute (assumed: op-level
  SAC keeps the matmul outputs, Megatron's the core attention); a layer interval is
  refused. The mode must be given: torchtitan's default changed across versions.
- compile.enable false (torchtitan's default): eager elementwise kernels
  (--no-fused-elementwise); true: fused kernels (assumed for torch.compile's fusion).
Accepted and listed as ignored: sections and keys that change no modelled time or byte.
Noted as assumed: mixed_precision_reduce float32 (gradients reduced in 16 bits here).
"""
from __future__ import annotations

from typing import Any

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import MODEL_PRESETS

from .config_reading import Settings, read_mapping

IGNORED_SECTIONS = {"job", "profiling", "metrics", "checkpoint", "comm", "lr_scheduler",
                    "validation", "fault_tolerance", "experimental", "memory_estimation",
                    "quantize"}
IGNORED_KEYS = {
    "model.tokenizer_path", "model.hf_assets_path", "model.print_after_conversion",
    "optimizer.lr", "optimizer.eps", "optimizer.weight_decay", "optimizer.beta1",
    "optimizer.beta2", "optimizer.implementation", "optimizer.early_step_in_backward",
    "training.max_norm", "training.steps", "training.warmup_steps", "training.dataset",
    "training.dataset_path", "training.gc_freq", "training.seed", "training.deterministic",
    "parallelism.disable_loss_parallel", "parallelism.pipeline_parallel_split_points",
    "parallelism.module_fqns_per_model_part", "float8.filter_fqns", "float8.emulate",
    "float8.precompute_float8_dynamic_scale_for_fsdp", "float8.recipe_name",
    "float8.force_recompute_fp8_weight_in_bwd", "compile.components", "compile.backend",
    "activation_checkpoint.preserve_rng_state", "activation_checkpoint.early_stop",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns"}
SCALARS = {  # key -> this CLI's flag
    "training.seq_len": "seq_length", "training.global_batch_size": None,
    "parallelism.tensor_parallel_degree": "tp", "parallelism.pipeline_parallel_degree": "pp",
    "parallelism.context_parallel_degree": "cp", "parallelism.expert_parallel_degree": "ep",
    "parallelism.expert_tensor_parallel_degree": "etp",
    "parallelism.pipeline_parallel_schedule": "schedule",
    "parallelism.pipeline_parallel_layers_per_stage": "num_layers_per_virtual_pipeline_stage",
}
DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def settings(path: str) -> tuple[Settings, list[str]]:
    """This CLI's settings for torchtitan job `path` (key -> {flag: value}), and the
    notes (module docstring)."""
    source = f"--torchtitan-config {path}"
    data = read_mapping(path, "--torchtitan-config")
    flat = {f"{section}.{key}": value for section, table in data.items()
            for key, value in (table.items() if isinstance(table, dict) else [(None, table)])}
    out: Settings = []
    ignored, assumed = [], []
    for key, value in flat.items():
        section = key.split(".")[0]
        if section in IGNORED_SECTIONS or key in IGNORED_KEYS:
            ignored.append(key)
        elif key in SCALARS and SCALARS[key]:
            out.append((key, {SCALARS[key]: value}))
        elif key not in _READ:
            raise ConfigError(f"{source}: unknown key {key!r}; rule: torchtitan's JobConfig "
                              f"keys that this simulator reads or lists")
    out += _model(source, flat, assumed) + _batch(source, flat)
    out += _data_parallel(source, flat) + _recompute(source, flat, assumed)
    tp = _get(flat, "parallelism.tensor_parallel_degree", 1)
    if tp > 1:
        out.append(("parallelism.tensor_parallel_degree", {"sequence_parallel": True}))
        if _get(flat, "parallelism.enable_async_tensor_parallel", False):
            out.append(("parallelism.enable_async_tensor_parallel",
                        {"tp_comm_overlap": True}))
            assumed.append("async TP as Transformer Engine's overlap (--tp-comm-overlap)")
    if _get(flat, "training.mixed_precision_reduce", "float32") == "float32":
        assumed.append("training.mixed_precision_reduce float32: gradients reduced in the "
                       "16-bit parameter dtype here (fp32 moves twice the bytes)")
    notes = [f"{source}: not modelled as set, assumed instead: {'; '.join(assumed)}"] \
        if assumed else []
    if ignored:
        notes.append(f"{source}: ignored, no effect on a modelled time or byte: "
                     f"{', '.join(ignored)}")
    return out, notes


_READ = {"model.name", "model.flavor", "model.converters", "training.local_batch_size",
         "training.batch_size", "training.mixed_precision_param",
         "training.mixed_precision_reduce", "training.enable_cpu_offload",
         "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
         "parallelism.fsdp_reshard_after_forward", "parallelism.enable_async_tensor_parallel",
         "parallelism.pipeline_parallel_microbatch_size",
         "parallelism.context_parallel_rotate_method", "activation_checkpoint.mode",
         "activation_checkpoint.selective_ac_option", "compile.enable",
         "float8.enable_fsdp_float8_all_gather", *SCALARS}


def _get(flat: dict[str, Any], key: str, default: Any) -> Any:
    return flat.get(key, default)


def _model(source: str, flat: dict[str, Any], assumed: list[str]) -> Settings:
    name, flavor = _get(flat, "model.name", None), _get(flat, "model.flavor", None)
    preset = f"{name}-{flavor}".lower() if name and flavor else None
    if preset not in MODEL_PRESETS:
        raise ConfigError(f"{source}: model.name={name!r} flavor={flavor!r}: no preset "
                          f"{preset!r} (presets: {', '.join(MODEL_PRESETS)}); give --model "
                          f"or the dimensions")
    fp8 = "float8" in (_get(flat, "model.converters", []) or [])
    param = _get(flat, "training.mixed_precision_param", "bfloat16")
    if param not in DTYPES:
        raise ConfigError(f"{source}: training.mixed_precision_param={param!r} must be one of "
                          f"{', '.join(DTYPES)}")
    if _get(flat, "training.enable_cpu_offload", False):
        raise ConfigError(f"{source}: training.enable_cpu_offload: FSDP2's offload of "
                          f"parameters and gradients is not modelled (only the optimizer's)")
    compiled = _get(flat, "compile.enable", False)
    if compiled:
        assumed.append("compile.enable: torch.compile's fusion as Megatron/TE's fused kernels")
    out = [("model.name/flavor", {"model": preset}),
           ("training.mixed_precision_param", {"dtype": "fp8" if fp8 else DTYPES[param]}),
           ("compile.enable", {"fused_elementwise": bool(compiled)})]
    if _get(flat, "float8.enable_fsdp_float8_all_gather", False):
        out.append(("float8.enable_fsdp_float8_all_gather", {"fp8_param_gather": True}))
    return out


def _batch(source: str, flat: dict[str, Any]) -> Settings:
    local = _get(flat, "training.local_batch_size", _get(flat, "training.batch_size", 8))
    pp = _get(flat, "parallelism.pipeline_parallel_degree", 1)
    micro = _get(flat, "parallelism.pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    if not all(isinstance(v, int) and v > 0 for v in (local, micro)) or local % micro:
        raise ConfigError(f"{source}: training.local_batch_size={local!r} must be a multiple "
                          f"of the micro-batch ({micro!r}: "
                          f"parallelism.pipeline_parallel_microbatch_size with pp > 1)")
    per_step = local // micro
    total = _get(flat, "training.global_batch_size", -1)
    if total == -1:
        return [("training.local_batch_size", {"micro_batch_size": micro,
                                               "microbatches": per_step})]
    return [("training.local_batch_size", {"micro_batch_size": micro}),
            ("training.global_batch_size", {"global_batch_size": total})]


def _data_parallel(source: str, flat: dict[str, Any]) -> Settings:
    replicate = _get(flat, "parallelism.data_parallel_replicate_degree", 1)
    shard = _get(flat, "parallelism.data_parallel_shard_degree", -1)
    if shard == -1:
        raise ConfigError(f"{source}: parallelism.data_parallel_shard_degree=-1 takes the GPUs "
                          f"left, which needs the launch's world size: give the degree")
    if not all(isinstance(v, int) and v > 0 for v in (replicate, shard)):
        raise ConfigError(f"{source}: the data-parallel degrees must be positive integers, "
                          f"got replicate={replicate!r} shard={shard!r}")
    values: dict[str, Any] = {"dp": replicate * shard}
    if shard > 1:
        values["fsdp"] = "hybrid" if replicate > 1 else "full"
        if replicate > 1:
            values["shard_size"] = shard
        reshard = _get(flat, "parallelism.fsdp_reshard_after_forward", "default")
        if reshard == "never":
            values["reshard_after_forward"] = False
        elif reshard not in ("default", "always"):
            raise ConfigError(f"{source}: parallelism.fsdp_reshard_after_forward={reshard!r} "
                              f"must be default, always or never")
    rotate = _get(flat, "parallelism.context_parallel_rotate_method", "allgather")
    if _get(flat, "parallelism.context_parallel_degree", 1) > 1 and rotate != "alltoall":
        raise ConfigError(f"{source}: parallelism.context_parallel_rotate_method={rotate!r}: "
                          f"ring attention by all-gather is not modelled (alltoall, the "
                          f"passing of KV around the ring, is)")
    return [("parallelism.data_parallel_*_degree", values)]


def _recompute(source: str, flat: dict[str, Any], assumed: list[str]) -> Settings:
    mode = _get(flat, "activation_checkpoint.mode", None)
    if mode not in ("none", "full", "selective"):
        raise ConfigError(f"{source}: activation_checkpoint.mode={mode!r}: give none, full or "
                          f"selective (torchtitan's default changed across versions)")
    if mode == "selective":
        option = str(_get(flat, "activation_checkpoint.selective_ac_option", "op"))
        if option != "op":
            raise ConfigError(f"{source}: activation_checkpoint.selective_ac_option={option!r}"
                              f": checkpointing every n-th layer is not modelled ('op' is)")
        assumed.append("op-level selective AC as Megatron's selective recompute")
    return [("activation_checkpoint.mode", {"recompute": mode})]
