"""`clustersim memory`: each pipeline rank's memory for a configuration, without simulating.

The numbers come from schedules.memory_model (ZeRO model states, Korthikanti activations
per in-flight microbatch, communication buffers; `(s,mb)` counts the (stage, microbatch)
activations held, a microbatch once per virtual stage). Bytes in the JSON; the table prints
GB (1e9 bytes, as ZeRO's Table 1 and the GPU datasheets do) and the total in GiB (2^30,
what `nvidia-smi` and torch report). With --topology or --device, ranks whose total
exceeds the device memory are flagged OOM (and an FP8 recipe the device cannot run is
refused). Under --dtype fp8 a column shows TE's FP8 weight copies (part of the model
states) and notes say what the FP8 settings assume (schedules.model.fp8_notes). Under
LoRA `params` counts the adapters, a `frozen` column the frozen base (whose stored bytes
are in `weights`), and notes say what LoRA assumes (schedules.lora.lora_notes). Under
ZeRO-Infinity's NVMe tier (--offload-device nvme) an `nvme` column shows the optimizer
states on the node's NVMe; `host` then holds DeepSpeed's pinned swap buffers.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict

from tabulate import tabulate

from clustersim.schedules.cluster_facts import ClusterFacts
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.memory_model import (FP16_GRADIENT_COPY, RankMemory,
                                               bare_rank_memory, optimizer_memory_bytes,
                                               precision_bytes, rank_memory)
from clustersim.schedules.fp8 import check_fp8_device, fp8_notes
from clustersim.schedules.lora import lora_notes
from clustersim.schedules.plan import resolve
from clustersim.schedules.recompute import describe as describe_recompute
from clustersim.schedules.sharding import shard_group_size
from clustersim.topologies import DeviceSpec, device_of, get_device, gpu_nodes, load_topology

from ..cluster import cluster_facts
from .config_files import add_config_flags
from .flags import (MODEL_FLAGS, PARALLEL_FLAGS, SHARDING_FLAGS, add_model_flags,
                    add_parallel_flags, given, max_ops_from_args, model_from_args,
                    parallel_from_args)

GB, GIB = 1e9, 2**30
ACTIVATION_ONLY = ("vpp", "sequence_parallel", "num_microbatches", "global_batch_size",
                   "recompute", "recompute_granularity", "recompute_activations",
                   "recompute_method", "recompute_num_layers")
"""Fields that move only activations, which --params does not count."""
MAX_PARAMS = 1e18  # a bare count far above any model, below float overflow in the formulas
_SUFFIXES = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
NVME_NOTE = ("offload_device nvme: the optimizer states are on the node's NVMe (`nvme`); "
             "`host` is DeepSpeed's pinned swap buffers at its defaults, buffer_count 4 x fp32 "
             "x min(shard, sub_group_size 1e9) (schedules.memory_model)")


def parse_count(text: str) -> float:
    """'7.5e9', '7.5B', '128b', '1T' -> a parameter count."""
    key = text.strip().lower()
    scale = _SUFFIXES.get(key[-1:], 1) if key[-1:].isalpha() else 1
    try:
        value = float(key[:-1] if scale != 1 else key) * scale
    except ValueError:
        value = 0.0
    if not 1 <= value <= MAX_PARAMS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a parameter count between 1 and "
                                         f"{MAX_PARAMS:.0e} (e.g. 7.5e9, 7.5B)")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "memory", help="per-rank memory breakdown of a configuration (no simulation)",
        description="Print each pipeline rank's parameters, gradients, optimizer states "
                    "(per ZeRO stage), activations and buffers, without simulating time.")
    p.add_argument("--params", type=parse_count, metavar="COUNT",
                   help="a bare parameter count (7.5e9 or 7.5B): model states only, "
                        "instead of --model")
    add_parallel_flags(p, pp_default=1)
    add_model_flags(p)
    add_config_flags(p)
    g = p.add_argument_group("device (for the OOM flag)")
    g.add_argument("--topology", help="preset or topology JSON: its GPU memory and GPUs "
                                      "per node (hybrid and hpZ groups)")
    g.add_argument("--device", help="a device name (h100, a100, ...) for its memory")
    p.add_argument("--json", action="store_true", help="print the breakdown as JSON")


def _device(args: argparse.Namespace) -> tuple[DeviceSpec | None, ClusterFacts | None]:
    """(the device, the cluster's facts) from --topology or --device."""
    if args.topology and args.device:
        raise ConfigError("give --topology or --device, not both")
    if args.device:
        return get_device(args.device), None
    if args.topology:
        topology = load_topology(args.topology)
        return device_of(topology, gpu_nodes(topology)[0]), cluster_facts(topology)
    return None, None


def breakdown(args: argparse.Namespace) -> tuple[dict, list[RankMemory]]:
    """The configuration (as a JSON-able dict) and the per-rank memory it needs."""
    device, cluster = _device(args)
    name, capacity = (device.name, device.memory_bytes) if device else (None, None)
    notes: list[str] = []
    if args.params is not None:
        fields = given(args, MODEL_FLAGS)
        dims = [flag.names[0] for flag in MODEL_FLAGS if flag.field in fields]
        if args.model or dims:
            drop = (["--model"] if args.model else []) + dims
            raise ConfigError(f"--params is a bare parameter count: drop {', '.join(drop)}")
        asked = given(args, PARALLEL_FLAGS + SHARDING_FLAGS)
        moot = [flag.names[0] for flag in PARALLEL_FLAGS + SHARDING_FLAGS
                if flag.field in asked and flag.field in ACTIVATION_ONLY]
        moot += ["--schedule"] if getattr(args, "schedule", None) else []
        if moot:
            raise ConfigError(f"--params counts model states only, no activations: "
                              f"{', '.join(moot)} would change nothing (give --model)")
        parallel = parallel_from_args(args, args.schedule)
        ranks = bare_rank_memory(args.params, parallel, shard_group_size(parallel, cluster))
        model, dtype = f"{args.params:g} parameters", "bf16"
    else:
        spec = model_from_args(args)
        if device:
            check_fp8_device(spec, device.name, device.compute_capability)
        parallel = parallel_from_args(args, args.schedule, micro_batch_size=spec.micro_batch_size,
                                      num_layers=spec.num_layers)
        ranks = rank_memory(resolve(spec, parallel, cluster, max_ops=max_ops_from_args(args)))
        model, dtype = spec.name or "custom", spec.dtype
        notes = fp8_notes(spec, parallel.sequence_parallel) + lora_notes(spec)
    if parallel.nvme_offload:
        notes = notes + [NVME_NOTE]
    config = {"model": model, "dtype": dtype,
              "optimizer_bytes_per_param": optimizer_memory_bytes(dtype),
              "parallel": asdict(parallel),
              "device": name, "device_memory_bytes": capacity,
              "gpus_per_node": cluster.gpus_per_node if cluster else None, "notes": notes}
    return config, ranks


def memory_json(config: dict, ranks: Sequence[RankMemory]) -> dict:
    capacity = config["device_memory_bytes"]
    oom = [r.pp_rank for r in ranks if capacity is not None and r.total_bytes > capacity]
    return {"config": config,  # "oom" None (and "oom_ranks" None): no device, not checked
            "ranks": [{**r.to_dict(), "oom": None if capacity is None else r.pp_rank in oom}
                      for r in ranks],
            "model_states_bytes": [r.model_states_bytes for r in ranks],
            "total_bytes": [r.total_bytes for r in ranks],
            "host_bytes": [r.host for r in ranks], "nvme_bytes": [r.nvme for r in ranks],
            "oom_ranks": None if capacity is None else oom}


def _gb(nbytes: float) -> str:
    value = nbytes / GB
    return f"{value:.0f}" if value >= 100 else f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def _grid(p: dict) -> str:
    """' (2.5d, depth 2)' for a tp grid, '' for 1D."""
    if p.get("tp_mode", "1d") == "1d":
        return ""
    return f" ({p['tp_mode']}" + (f", depth {p['tp_depth']})" if p.get("tp_depth") else ")")


def format_memory(data: dict) -> str:
    """The table; under fp8 with a column for TE's FP8 weight copies (in `states`), with
    one for stashed weight versions (PipeDream, 2BW; in `states`) when any, one for
    FSDP's unsharded gradients (with a pipeline) when any, under NVMe offload one for the
    states on NVMe, and the run's notes. states, activ., recomp., buffers, gathered and
    unsh. grads sum to total."""
    c, p = data["config"], data["config"]["parallel"]
    fp8 = c["dtype"] == "fp8"
    nvme = p["offload_device"] == "nvme"
    lora = any(r["frozen_params"] for r in data["ranks"])  # params: the adapters
    stash = any(r["stashed_weights"] for r in data["ranks"])  # PipeDream's versions
    unsharded = any(r["unsharded_gradients"] for r in data["ranks"])  # FSDP with pp
    recompute = describe_recompute(p["recompute"], p["recompute_method"],
                                   p["recompute_num_layers"])
    optimizer = (f"Adam K={c['optimizer_bytes_per_param']} B/param" if c["dtype"] != "fp16"
                 else f"Adam K={precision_bytes('fp16')[1]} + fp32 gradient copy "
                      f"{FP16_GRADIENT_COPY} = {c['optimizer_bytes_per_param']} B/param")
    lines = [f"{c['model']} ({c['dtype']}, {optimizer}): "
             f"ZeRO-{p['zero_stage']} fsdp={p['fsdp']} dp={p['dp']} tp={p['tp']}{_grid(p)} "
             f"pp={p['pp']} "
             f"{p['schedule']} microbatches={p['num_microbatches']} recompute={recompute}"
             + (f" offload ({p['offload_device'] or 'cpu'})" if p["offload"] else ""),
             "GB = 1e9 bytes per rank"
             + (f"; {c['device']} has {c['device_memory_bytes'] / GB:.1f} GB"
                if c["device"] else "; no device given (--topology or --device): whether "
                                    "a rank fits is not checked")]
    columns = [  # header, value of a rank's row, shown
        ("rank", lambda r: r["pp_rank"], True),
        ("params", lambda r: f"{r['params']:.3g}", True),
        ("frozen", lambda r: f"{r['frozen_params']:.3g}", lora),
        ("weights", lambda r: _gb(r["parameters"] + r["hpz_secondary"]), True),
        ("fp8 w.", lambda r: _gb(r["fp8_weights"]), fp8),
        ("stashed", lambda r: _gb(r["stashed_weights"]), stash),
        ("grads", lambda r: _gb(r["gradients"]), True),
        ("optim", lambda r: _gb(r["optimizer_states"]), True),
        ("states", lambda r: _gb(r["model_states_bytes"]), True),
        ("activ.", lambda r: _gb(r["activations"]), True),
        ("(s,mb)", lambda r: r["in_flight"], True),
        ("recomp.", lambda r: _gb(r["recompute_working"]), True),
        ("buffers", lambda r: _gb(r["communication_buffers"]), True),
        ("gathered", lambda r: _gb(r["gathered_parameters"]), True),
        ("unsh. grads", lambda r: _gb(r["unsharded_gradients"]), unsharded),
        ("total", lambda r: _gb(r["total_bytes"]), True),
        ("GiB", lambda r: f"{r['total_bytes'] / GIB:.2f}", True),
        ("host", lambda r: _gb(r["host"]), True), ("nvme", lambda r: _gb(r["nvme"]), nvme),
        ("", lambda r: "OOM" if r["oom"] else "", True)]
    shown = [(header, value) for header, value, on in columns if on]
    lines.append(tabulate([[value(r) for _, value in shown] for r in data["ranks"]],
                          headers=[header for header, _ in shown], tablefmt="plain",
                          disable_numparse=True, colalign=["right"] * len(shown)).rstrip())
    for rank in data["oom_ranks"] or ():
        total = data["total_bytes"][rank]
        lines.append(f"OOM: rank {rank} needs {total / GB:.1f} GB, the {c['device']} has "
                     f"{c['device_memory_bytes'] / GB:.1f} GB")
    return "\n".join(lines + [f"note: {note}" for note in c["notes"]])


def cmd_memory(args: argparse.Namespace) -> int:
    data = memory_json(*breakdown(args))
    print(json.dumps(data, indent=2) if args.json else format_memory(data))
    return 0


COMMANDS = {"memory": cmd_memory}
