"""`clustersim simulate`, `show`, `compare` (several schedules, or two Timelines such as
simulated against measured: sim.timeline_compare), `models` and `topologies`: their
parsers and what each does. Flags and the fields they set: sim.cli.flags."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

import networkx as nx

from clustersim.schedules.errors import ClustersimError, ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.model_presets import MODEL_PRESETS
from clustersim.schedules.output_files import check_outputs, write_output, write_text_atomic
from clustersim.schedules.p2p import add_p2p
from clustersim.schedules.parallel import CUSTOM_SCHEDULE, ParallelConfig
from clustersim.schedules.plan import Plan, resolve
from clustersim.schedules.registry import (SCHEDULES, build_schedule, canonical_schedule_name,
                                           schedule_entry)
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.torch_csv import check_exportable, read_torch_csv, to_torch_csv
from clustersim.schedules.validate import validate
from clustersim.topologies import list_presets, load_topology

from ..report import format_summary, format_table
from ..resilience import plan_checkpoints
from ..simulate import simulate, simulate_schedule
from ..cluster import cluster_facts
from .config_files import add_config_flags
from .replay_flags import add_replay_flags, faulted_topology, replaying_from_args
from .resilience_flags import add_resilience_flags, resilience_from_args
from .flags import (add_cluster_flags, add_intra_layer_flags, add_limit_flags,
                    add_model_flags, add_parallel_flags, cost_model_from_args, flag,
                    max_ops_from_args, model_from_args, parallel_from_args)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    add_simulate_flags(sub.add_parser(
        "simulate", help="simulate one iteration to a Gantt HTML",
        description="Simulate one training iteration and write a Gantt chart."))

    show = sub.add_parser("show", help="print a schedule's rank x step grid or torch CSV",
                          description="Print a schedule without simulating it.")
    show.add_argument("schedule", help=", ".join(SCHEDULES) + " (or an alias)")
    for field in ("pp", "num_microbatches"):
        flag(field).add_to(show, required=True)
    flag("vpp").add_to(show)
    show.add_argument("--format", choices=["grid", "text", "torch-csv"], default="grid",
                      help="grid: unit-time rank x step table (default); text: program per "
                           "rank; torch-csv: torch.distributed.pipelining CSV")
    show.add_argument("--with-p2p", action="store_true",
                      help="include SEND/RECV ops (text and torch-csv formats)")
    add_limit_flags(show)

    cmp = sub.add_parser(
        "compare", help="simulate several schedules side by side, or compare two Timelines",
        description="Without files: simulate several schedules on the same model and cluster. "
                    "With two Timeline JSON files (`compare sim.json measured.json`): print "
                    "the iteration-time error and per-op-kind mean duration errors of A "
                    "against B, and with -o write both Gantt charts stacked.")
    cmp.add_argument("timelines", nargs="*", metavar="TIMELINE.json",
                     help="two Timeline JSON files A B (from --timeline-json of simulate or "
                          "run) or PyTorch profiler traces (torch.profiler's Chrome JSON, "
                          "sim/kineto.py); B is the reference")
    cmp.add_argument("--schedules", default="gpipe,1f1b,interleaved-1f1b",
                     help="comma-separated; NAME:V sets vpp, e.g. interleaved-1f1b:4 "
                          f"(schedules: {', '.join(SCHEDULES)})")
    add_parallel_flags(cmp, with_schedule=False)
    add_intra_layer_flags(cmp)
    add_model_flags(cmp)
    add_cluster_flags(cmp)
    add_config_flags(cmp)
    cmp.add_argument("-o", "--output", help="HTML with the Gantt charts stacked")
    cmp.add_argument("--json", action="store_true", help="print the table as JSON")

    sub.add_parser("models", help="list model presets")
    sub.add_parser("topologies", help="list topology presets and device datasheets (peaks, "
                                      "HBM, scale-up links, measured matmul ceilings)")


def add_simulate_flags(sim: argparse.ArgumentParser) -> None:
    """Every flag of `simulate` (also what `sweep` takes, sim.cli.sweep_command)."""
    add_parallel_flags(sim)
    add_intra_layer_flags(sim)
    add_model_flags(sim)
    add_cluster_flags(sim)
    add_output_flags(sim, timeline_default=None)
    add_config_flags(sim)
    add_resilience_flags(sim)
    add_replay_flags(sim)
    sim.add_argument("--schedule-out", metavar="PATH",
                     help="write the compute order the run replayed as a torch.distributed."
                          "pipelining CSV (zb-auto: the order built for this run's costs), "
                          "to run with `clustersim run --schedule-csv PATH` or torch's "
                          "_PipelineScheduleRuntime")


def add_output_flags(parser: argparse.ArgumentParser, timeline_default: str | None) -> None:
    """The custom schedule in, and the outputs write_outputs writes (simulate and run)."""
    group = parser.add_argument_group("outputs")
    group.add_argument("--schedule-csv", metavar="PATH",
                       help="run a custom schedule from a torch.distributed.pipelining CSV")
    group.add_argument("-o", "--output", help=f"HTML report: the plan, headline numbers, an "
                                                 f"out-of-memory banner, the Gantt and the "
                                                 f"memory plot (default {DEFAULT_HTML})")
    group.add_argument("--no-html", action="store_true",
                       help="write no Gantt HTML (scripted use)")
    group.add_argument("--trace-json", metavar="PATH", help="Chrome/Perfetto trace JSON")
    group.add_argument("--metrics-json", metavar="PATH",
                       help="metrics JSON; '-' prints it to stdout alone (the summary and "
                            "the 'wrote' lines then go to stderr)")
    group.add_argument("--chakra-out", metavar="DIR",
                       help="the run as Chakra execution traces (MLCommons; what ASTRA-sim "
                            "replays): DIR/clustersim.<rank>.et per GPU and "
                            "DIR/comm_group.json (pip install -e '.[chakra]')")
    group.add_argument("--timeline-json", default=timeline_default, metavar="PATH",
                       help="the Timeline as JSON" + (f" (default {timeline_default})"
                                                      if timeline_default else ""))


def _json_writer(data: object):
    return lambda path: write_text_atomic(path, json.dumps(data, indent=2))


def schedule_and_parallel(args: argparse.Namespace,
                          model: ModelSpec) -> tuple[Schedule | None, ParallelConfig]:
    """The custom schedule of `--schedule-csv` (None without it) and the parallel config;
    a custom schedule fixes pp, vpp, the microbatch count and the schedule, so a flag
    that sets one of them differently is refused. Shared by simulate and run."""
    if args.schedule_csv is None:
        return None, parallel_from_args(args, args.schedule,
                                        micro_batch_size=model.micro_batch_size,
                                        num_layers=model.num_layers)
    if not args.schedule_csv.strip():
        raise ConfigError("--schedule-csv: an empty path (give the CSV file, or leave the "
                          "flag out to run --schedule)")
    custom = read_torch_csv(args.schedule_csv)
    fixed = {"--pp": ("pp", custom.num_ranks), "--vpp": ("vpp", custom.stages_per_rank),
             "--microbatches": ("num_microbatches", custom.num_microbatches)}
    for name, (field, value) in fixed.items():
        given_value = getattr(args, field, None)
        if given_value is not None and given_value != value:
            raise ConfigError(f"{name} {given_value} conflicts with --schedule-csv "
                              f"{args.schedule_csv}, which has {value}: leave {name} out")
    if args.schedule is not None:
        raise ConfigError(f"--schedule {args.schedule} conflicts with --schedule-csv "
                          f"{args.schedule_csv}: the CSV is the schedule; give one of them")
    for _, (field, value) in fixed.items():
        setattr(args, field, value)
    return custom, parallel_from_args(args, CUSTOM_SCHEDULE,
                                      micro_batch_size=model.micro_batch_size,
                                      num_layers=model.num_layers)


DEFAULT_HTML = "gantt.html"
STDOUT = "-"  # --metrics-json - : the metrics on stdout


def output_paths(args: argparse.Namespace) -> dict[str, str | None]:
    """The files simulate and run write: flag -> path (None: not asked for; the metrics
    on stdout are not a file)."""
    if args.no_html and args.output is not None:
        raise ConfigError(f"--no-html and --output {args.output} both given: give one")
    html = None if args.no_html else (args.output or DEFAULT_HTML)
    metrics = None if args.metrics_json == STDOUT else args.metrics_json
    return {"--output": html, "--trace-json": args.trace_json, "--metrics-json": metrics,
            "--timeline-json": args.timeline_json}


def report_stream(args: argparse.Namespace) -> TextIO:
    """Where the summary and the 'wrote' lines go: stderr when stdout carries the metrics
    JSON (--metrics-json -), else stdout."""
    return sys.stderr if args.metrics_json == STDOUT else sys.stdout


def input_paths(args: argparse.Namespace) -> dict[str, str | None]:
    """The files a run reads: flag -> path (None: not given; a topology preset name is
    not a file)."""
    topology = getattr(args, "topology", None)
    return {"--schedule-csv": args.schedule_csv, "--profile": getattr(args, "profile", None),
            "--gemm-table": getattr(args, "gemm_table", None),
            "--topology": topology if topology and Path(topology).exists() else None}


def _write_html(timeline: Timeline, path, trace_path: str | None) -> None:
    from ..html_report import write_report  # here: plotly only when a page is written
    write_report(timeline, path, trace_path=trace_path)


def write_outputs(timeline: Timeline, args: argparse.Namespace, plan: Plan | None = None
                  ) -> None:
    """Gantt HTML, and the trace, metrics and Timeline JSON files the flags ask for, each
    written atomically (schedules.output_files); the Chakra traces (`plan`: the run's,
    needed for a custom schedule; else rebuilt from the Timeline's meta)."""
    from ..trace import write_trace

    writers = {"--output": lambda path: _write_html(timeline, path, args.trace_json),
               "--trace-json": lambda path: write_trace(timeline, path),
               "--metrics-json": _json_writer(timeline.metrics()),
               "--timeline-json": timeline.save}
    for flag_name, path in output_paths(args).items():
        if path is not None:
            print(write_output(path, writers[flag_name]), file=report_stream(args))
    if args.chakra_out is not None:
        from ..chakra import write_chakra
        paths = write_chakra(timeline, args.chakra_out, plan)
        print(f"wrote {len(paths)} Chakra files to {args.chakra_out}", file=report_stream(args))
    if args.metrics_json == STDOUT:
        print(json.dumps(timeline.metrics(), indent=2))


def simulate_from_args(args: argparse.Namespace, exported: bool = False) -> tuple[
        ModelSpec, ParallelConfig, nx.DiGraph, Schedule | None, Schedule, Timeline]:
    """The run the simulate flags describe: the model, the parallel config, the topology,
    the custom schedule (None without --schedule-csv), the schedule replayed and its
    Timeline (`exported`: refuse first a schedule torch's CSV cannot hold)."""
    model = model_from_args(args)
    custom, parallel = schedule_and_parallel(args, model)
    if exported and custom is None:
        check_exportable(schedule_entry(parallel.schedule), "--schedule-out")
    topology = faulted_topology(load_topology(args.topology), args)
    schedule, timeline = simulate_schedule(model, parallel, topology, custom,
                                           cost_model_from_args(args), max_ops_from_args(args),
                                           replaying_from_args(args))
    return model, parallel, topology, custom, schedule, timeline


def cmd_simulate(args: argparse.Namespace) -> int:
    check_outputs({**output_paths(args), "--schedule-out": args.schedule_out},
                  input_paths(args))
    model, parallel, topology, custom, schedule, timeline = simulate_from_args(
        args, exported=args.schedule_out is not None)
    settings = resilience_from_args(args)
    checkpoints = None if settings is None else plan_checkpoints(
        settings, model, parallel.world_size, timeline.iteration_time)
    if checkpoints is not None:
        timeline.meta["resilience"] = checkpoints.to_dict()
    print(format_summary(timeline), file=report_stream(args))
    if checkpoints is not None:
        print("\n".join(checkpoints.lines()), file=report_stream(args))
    plan = (resolve(model, parallel, cluster_facts(topology), custom)
            if custom is not None and args.chakra_out is not None else None)
    write_outputs(timeline, args, plan)
    if args.schedule_out is not None:
        print(write_output(args.schedule_out, lambda path: write_text_atomic(
            path, to_torch_csv(schedule))), file=report_stream(args))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    schedule = build_schedule(args.schedule, args.pp, args.num_microbatches, args.vpp,
                              max_ops_from_args(args))
    dry = validate(schedule)
    if args.with_p2p:
        schedule = add_p2p(schedule)
    if schedule.asynchronous is not None and args.format != "torch-csv":
        run = schedule.asynchronous
        print(f"# {run.batches} batches of {run.iteration_microbatches} microbatches back to "
              f"back, no flush; the data-parallel pass adds a step every {run.update_every} "
              f"microbatch(es) (schedules.weight_stashing)")
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


def cmd_compare_schedules(args: argparse.Namespace) -> int:
    check_outputs({"--output": args.output},
                  {"--topology": args.topology if Path(args.topology).exists() else None,
                   "--profile": args.profile})
    model = model_from_args(args)
    topology = load_topology(args.topology)
    costs = cost_model_from_args(args)
    results: list[tuple[str, Timeline]] = []
    schedules = _parse_schedule_list(args.schedules)
    limit = getattr(args, "activation_memory_limit_gb", None)
    if limit is not None and not any(schedule_entry(n).built_from_costs for n, _ in schedules):
        raise ConfigError("--activation-memory-limit caps the search of a schedule built from "
                          "costs (zb-auto); none of --schedules is one")
    for name, vpp in schedules:
        fixed_order = () if schedule_entry(name).built_from_costs else (
            "activation_memory_limit_gb",)  # the cap only shapes a schedule built from costs
        parallel = parallel_from_args(args, name, vpp, model.micro_batch_size, fixed_order,
                                      model.num_layers)
        label = name if parallel.vpp == 1 else f"{name} (vpp={parallel.vpp})"
        results.append((label, simulate(model, parallel, topology, None, costs,
                                        max_ops_from_args(args))))
    rows = [{"schedule": label, **_compare_row(t)} for label, t in results]
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    if args.output:
        from ..gantt import write_gantt_comparison
        print(write_output(args.output, lambda path: write_gantt_comparison(results, path)))
    return 0


def cmd_compare_timelines(args: argparse.Namespace) -> int:
    from ..kineto import is_kineto_trace, read_kineto  # here: only `compare A B` reads them
    from ..timeline_compare import compare_timelines, format_comparison

    if len(args.timelines) != 2:
        raise ConfigError(f"compare takes two Timeline JSON or PyTorch profiler trace files "
                          f"(A B), got {len(args.timelines)}: {' '.join(args.timelines)}")
    path_a, path_b = args.timelines
    check_outputs({"--output": args.output}, {"TIMELINE A": path_a, "TIMELINE B": path_b})
    timelines = []
    for path in (path_a, path_b):
        try:
            timelines.append(read_kineto(path) if is_kineto_trace(path) else
                             Timeline.load(path))
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, ClustersimError):
                raise
            raise ConfigError(f"{path} is not a Timeline JSON ({type(err).__name__}: {err}); "
                              "write one with --timeline-json") from None
    result = compare_timelines(*timelines)
    print(json.dumps(result, indent=2) if args.json
          else format_comparison(result, path_a, path_b))
    if args.output:
        from ..gantt import write_gantt_comparison
        items = [(f"A: {path_a} ({timelines[0].source})", timelines[0]),
                 (f"B: {path_b} ({timelines[1].source})", timelines[1])]
        print(write_output(args.output, lambda path: write_gantt_comparison(items, path)))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """`compare A.json B.json` compares two Timelines; without files, schedules."""
    if args.timelines:
        return cmd_compare_timelines(args)
    return cmd_compare_schedules(args)


def _compare_row(timeline: Timeline) -> dict:
    peaks = timeline.peak_in_flight()
    memory = timeline.peak_memory()
    figures = timeline.meta["throughput"]
    return {
        "iteration_time_s": timeline.iteration_time,
        "bubble_fraction": timeline.bubble_fraction,
        "exposed_comm_fraction": timeline.exposed_comm_fraction,
        "tokens_per_s": figures["tokens_per_s"],
        "tokens_per_s_per_gpu": figures["tokens_per_s_per_gpu"],
        "model_tflops_per_gpu": figures["model_tflops_per_gpu"],
        "mfu": figures["mfu"],
        "peak_in_flight": [peaks.get(r, 0) for r in timeline.ranks],
        "peak_memory_GB": max(memory.values(), default=0) / 1e9,
    }


def cmd_models(args: argparse.Namespace) -> int:
    for name, spec in MODEL_PRESETS.items():
        print(f"{name:12} {spec.param_count() / 1e9:8.2f} B params, {spec.num_layers} layers, "
              f"hidden {spec.hidden_size}, seq {spec.seq_length}")
    return 0


def cmd_topologies(args: argparse.Namespace) -> int:
    """The presets, then one line per device: dense bf16/fp8 peaks (TFLOP/s), HBM (GB,
    TB/s), scale-up link bandwidth per GPU per direction (GB/s) and the achievable matmul
    fraction per dtype with its source (topologies.devices documents every number)."""
    from clustersim.topologies import DEVICES, preset_description
    for name in list_presets():
        print(f"{name:12} {preset_description(name)}")
    print("\ndevices (dense peaks; memory: what CUDA reports as the total, 1 GB = 1e9 "
          "bytes; links per GPU per direction; matmul ceiling = best measured GEMM / peak):")
    print(f"{'device':15} {'bf16 TF':>8} {'fp8 TF':>8} {'memory GB':>9} {'TB/s':>5} "
          f"{'link GB/s':>19}  matmul ceiling [source]")
    for spec in DEVICES.values():
        fp8 = (f"{spec.peak_flops['fp8'] / 1e12:8.0f}" if "fp8" in spec.peak_flops
               else f"{'-':>8}")
        link = (f"{spec.nvlink_bandwidth / 1e9:.0f} {spec.interconnect}"
                if spec.nvlink_bandwidth else "none (PCIe)")
        ceiling = ", ".join(f"{k} {v:.0%}" for k, v in spec.matmul_ceiling.items()) or "-"
        source = f" [{spec.matmul_ceiling_source}]" if spec.matmul_ceiling_source else ""
        print(f"{spec.name:15} {spec.peak_flops['bf16'] / 1e12:8.0f} {fp8} "
              f"{spec.memory_bytes / 1e9:9.1f} {spec.hbm_bandwidth / 1e12:5.2f} {link:>19}  "
              f"{ceiling}{source}")
    return 0


COMMANDS = {"simulate": cmd_simulate, "show": cmd_show, "compare": cmd_compare,
            "models": cmd_models, "topologies": cmd_topologies}
