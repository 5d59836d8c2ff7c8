"""What each CLI command does, given parsed arguments; the parser lives in sim.cli."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.registry import build_schedule, canonical_schedule_name, schedule_entry
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.model_presets import MODEL_PRESETS, get_model
from clustersim.schedules.parallel import CUSTOM_SCHEDULE, ParallelConfig
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.profile import Profile
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.torch_csv import read_torch_csv, to_torch_csv
from clustersim.schedules.validate import validate
from clustersim.topologies import list_presets, load_topology

from .collective_cli import cmd_collective
from .cost_model import (CostModel, ProfileCostModel, RooflineCostModel,
                         parse_uniform_costs)
from .report import format_summary, format_table
from .simulate import simulate

log = logging.getLogger(__name__)

DEFAULT_MODEL, DEFAULT_TOPOLOGY = "llama3-8b", "dgx-h100"
DEFAULT_PP, DEFAULT_MICROBATCHES = 8, 16

# Megatron flag name -> type; each overrides the preset's field of the same name.
MODEL_DIM_FLAGS = {
    "num-layers": int, "hidden-size": int, "ffn-hidden-size": int,
    "num-attention-heads": int, "num-query-groups": int, "seq-length": int,
    "vocab-size": int, "micro-batch-size": int, "dtype": str, "swiglu": bool,
    "use-flash-attn": bool,
}


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    overrides = {}
    for flag in MODEL_DIM_FLAGS:
        value = getattr(args, flag.replace("-", "_"))
        if value is not None:
            overrides[flag.replace("-", "_")] = value
    return get_model(args.model, **overrides)


# argparse dest -> the ParallelConfig field or alias it feeds (schedules.parallel_aliases)
SHARDING_ARGS = {
    "sequence_parallel": "sequence_parallel", "zero_stage": "zero_stage", "fsdp": "fsdp",
    "shard_size": "shard_size", "use_distributed_optimizer": "use_distributed_optimizer",
    "data_parallel_sharding_strategy": "data_parallel_sharding_strategy",
    "offload": "offload", "bucket_mb": "bucket_cap_mb",
    "overlap_grad_reduce": "overlap_grad_reduce",
    "reshard_after_forward": "reshard_after_forward",
    "quantized_weights": "quantized_weights", "hpz": "hpz",
    "hpz_partition_size": "hpz_partition_size", "quantized_gradients": "quantized_gradients",
    "recompute": "recompute", "recompute_granularity": "recompute_granularity",
    "recompute_method": "recompute_method",
}
INTRA_LAYER_ARGS = {  # schedules.intra_layer: the fields' own names, or Megatron's
    "tp_comm_overlap": "tp_comm_overlap", "cp_comm": "cp_comm", "cp_comm_type": "cp_comm_type",
    "moe_imbalance": "moe_imbalance", "scatter_gather": "scatter_gather",
}
SPLIT_ARGS = {  # schedules.pipeline_split
    "first_stage_layers": "first_stage_layers", "last_stage_layers": "last_stage_layers",
    "account_for_embedding": "account_for_embedding", "account_for_loss": "account_for_loss",
}


def parallel_from_args(args: argparse.Namespace, schedule: str, vpp: int | None = None,
                       micro_batch_size: int = 1) -> ParallelConfig:
    name = schedule if schedule == CUSTOM_SCHEDULE else canonical_schedule_name(schedule)
    vpp = vpp or args.vpp or (1 if name == CUSTOM_SCHEDULE else schedule_entry(name).default_vpp)
    microbatches = args.microbatches
    if microbatches is None and args.global_batch_size is None:
        microbatches = DEFAULT_MICROBATCHES
    options = {key: getattr(args, dest, None)
               for dest, key in {**SHARDING_ARGS, **INTRA_LAYER_ARGS, **SPLIT_ARGS}.items()}
    return ParallelConfig.from_kwargs(
        pp=args.pp, vpp=vpp, dp=args.dp, tp=args.tp, cp=getattr(args, "cp", 1),
        ep=getattr(args, "ep", 1), expert_tensor_parallel=getattr(args, "etp", None),
        schedule=name,
        num_microbatches=microbatches, global_batch_size=args.global_batch_size,
        micro_batch_size=micro_batch_size, rank_order=args.rank_order, **options)


def cost_model(args: argparse.Namespace) -> CostModel:
    """The cost model the flags choose (sim.cost_model): uniform F,B seconds, a measured
    profile, or the roofline at the given (or default) efficiencies."""
    efficiencies = {name: getattr(args, name) for name in ("compute_efficiency",
                                                           "memory_efficiency")
                    if getattr(args, name) is not None}
    if getattr(args, "profile", None):
        if args.uniform_costs:
            raise ConfigError("--profile and --uniform-costs both set compute times: give one")
        return ProfileCostModel(Profile.load(args.profile),
                                **{k: v for k, v in efficiencies.items()
                                   if k == "memory_efficiency"})
    if args.uniform_costs:
        return parse_uniform_costs(args.uniform_costs)
    return RooflineCostModel(**efficiencies)


def _write_json(path: str, data: object) -> None:
    Path(path).write_text(json.dumps(data, indent=2))
    print(f"wrote {path}")


def schedule_and_parallel(args: argparse.Namespace,
                          model: ModelSpec) -> tuple[Schedule | None, ParallelConfig]:
    """The custom schedule of `--schedule-csv` (None without it) and the parallel config;
    a custom schedule fixes pp, vpp and the microbatch count. Shared by simulate and run."""
    custom = read_torch_csv(args.schedule_csv) if args.schedule_csv else None
    if custom is not None:
        args.pp, args.vpp = custom.num_ranks, custom.stages_per_rank
        args.microbatches, args.schedule = custom.num_microbatches, CUSTOM_SCHEDULE
    return custom, parallel_from_args(args, args.schedule,
                                      micro_batch_size=model.micro_batch_size)


def write_outputs(timeline: Timeline, args: argparse.Namespace) -> None:
    """Gantt HTML, and the trace, metrics and Timeline JSON files the flags ask for."""
    from .gantt import write_gantt
    from .trace import write_trace

    print(f"wrote {write_gantt(timeline, args.output)}")
    if args.trace_json:
        write_trace(timeline, args.trace_json)
        print(f"wrote {args.trace_json}")
    if args.metrics_json:
        _write_json(args.metrics_json, timeline.metrics())
    if args.timeline_json:
        timeline.save(args.timeline_json)
        print(f"wrote {args.timeline_json}")


def cmd_simulate(args: argparse.Namespace) -> int:
    model = model_from_args(args)
    custom, parallel = schedule_and_parallel(args, model)
    topology = load_topology(args.topology)
    timeline = simulate(model, parallel, topology, custom, cost_model(args))
    print(format_summary(timeline))
    write_outputs(timeline, args)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    schedule = build_schedule(args.schedule, args.pp, args.microbatches, args.vpp)
    dry = validate(schedule)
    if args.with_p2p:
        from clustersim.schedules.p2p import add_p2p
        schedule = add_p2p(schedule)
    if args.format == "grid":
        print(dry.grid())
    elif args.format == "text":
        print(schedule.to_text())
    else:
        print(to_torch_csv(schedule, compute_only=not args.with_p2p), end="")
    return 0


def _parse_schedule_list(text: str) -> list[tuple[str, int | None]]:
    items = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, vpp = part.partition(":")
        if vpp and not vpp.isdigit():
            raise ConfigError(f"--schedules entry {part!r}: vpp after ':' must be an integer")
        items.append((canonical_schedule_name(name), int(vpp) if vpp else None))
    if not items:
        raise ConfigError("--schedules must name at least one schedule")
    return items


def cmd_compare(args: argparse.Namespace) -> int:
    model = model_from_args(args)
    topology = load_topology(args.topology)
    costs = cost_model(args)
    results: list[tuple[str, Timeline]] = []
    for name, vpp in _parse_schedule_list(args.schedules):
        parallel = parallel_from_args(args, name, vpp, model.micro_batch_size)
        label = name if parallel.vpp == 1 else f"{name} (vpp={parallel.vpp})"
        results.append((label, simulate(model, parallel, topology, None, costs)))
    rows = [{"schedule": label, **_compare_row(t)} for label, t in results]
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    if args.output:
        from .gantt import write_gantt_comparison
        print(f"wrote {write_gantt_comparison(results, args.output)}")
    return 0


def _compare_row(timeline: Timeline) -> dict:
    peaks = timeline.peak_in_flight()
    memory = timeline.peak_memory()
    return {
        "iteration_time_s": timeline.iteration_time,
        "bubble_fraction": timeline.bubble_fraction,
        "peak_in_flight": [peaks.get(r, 0) for r in timeline.ranks],
        "peak_memory_GB": max(memory.values(), default=0) / 1e9,
    }


def cmd_models(args: argparse.Namespace) -> int:
    for name, spec in MODEL_PRESETS.items():
        print(f"{name:12} {spec.param_count() / 1e9:8.2f} B params, {spec.num_layers} layers, "
              f"hidden {spec.hidden_size}, seq {spec.seq_length}")
    return 0


def cmd_topologies(args: argparse.Namespace) -> int:
    for name in list_presets():
        graph = load_topology(name)
        print(f"{name:12} {graph.graph.get('description', '')}")
    return 0


COMMANDS = {"simulate": cmd_simulate, "show": cmd_show, "compare": cmd_compare,
            "models": cmd_models, "topologies": cmd_topologies, "collective": cmd_collective}
