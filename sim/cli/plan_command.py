"""`clustersim plan`: search the layouts of a model on N GPUs and print the fastest
(sim.planner: enumerate, check, fit in memory, bound, replay the few that can win).
Its parser (`add_parser`) and handler (`cmd_plan`), registered in COMMANDS as the other
subcommand modules do."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.output_files import check_outputs, write_output, write_text_atomic
from clustersim.schedules.registry import schedule_entry
from clustersim.topologies import load_topology

from ..planner import SearchSpace, run_plan
from ..planner.report import format_report, to_json
from ..planner.space import PLANNABLE_SCHEDULES, plannable
from .arg_types import checked_number, positive_int
from .backend_flags import add_backend_flags

PLANNED_DTYPES = ("bf16", "fp16", "fp32")  # fp8 needs its recipe and device checks: simulate


_memory_gb = checked_number(float, lambda v: 0 < v < 1e6, "a memory size in GB > 0 (e.g. 80)")


def _once(values: list) -> tuple:
    """`values`, refused if one is listed twice (it would be searched twice)."""
    twice = sorted({str(v) for v in values if values.count(v) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{', '.join(twice)} listed twice")
    return tuple(values)


def _int_list(text: str) -> tuple[int, ...]:
    return _once([positive_int(part) for part in text.split(",")])


def _schedules(text: str) -> tuple[str, ...]:
    names = []
    for part in text.split(","):
        try:
            entry = schedule_entry(part)
        except ConfigError:
            raise argparse.ArgumentTypeError(
                f"unknown schedule {part.strip()!r}: choose from "
                f"{', '.join(PLANNABLE_SCHEDULES)}") from None
        if not plannable(entry):
            raise argparse.ArgumentTypeError(
                f"schedule {entry.name!r} is not searched (built from a run's costs, "
                f"asynchronous or bidirectional): choose from {', '.join(PLANNABLE_SCHEDULES)}")
        names.append(entry.name)
    return _once(names)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="search the fastest layout of a model on N GPUs (branch and bound)",
        description="Enumerate tp, pp, dp, cp, ep, virtual stages, micro-batch size, ZeRO "
                    "stage, recompute, sequence parallelism and schedule; drop what the "
                    "checks or the memory model refuse; bound the rest from below and "
                    "simulate event by event only those that can still win. (Serving "
                    "layouts under latency SLOs: `clustersim serve --search-layouts N "
                    "--goodput ttft:MS tpot:MS`.)")
    p.add_argument("--model", required=True, help="model preset (`clustersim models`)")
    p.add_argument("--gpus", type=_int_list, required=True, metavar="N[,N...]",
                   help="GPUs of the job; several counts (256,512,1024) search each, and "
                        "--html adds throughput against GPUs")
    p.add_argument("--topology", required=True, help="topology preset or JSON with at "
                                                     "least --gpus GPUs")
    p.add_argument("--global-batch-size", type=positive_int, required=True,
                   help="sequences per iteration")
    p.add_argument("--seq-length", type=positive_int, help="tokens per sequence "
                                                            "(default: the model's)")
    p.add_argument("--dtype", choices=PLANNED_DTYPES,
                   help="training precision (default: the model's, bf16 for the presets); "
                        "sets the bytes of weights, gradients and optimizer state "
                        "(`clustersim memory`) and the device's peak FLOP/s")
    p.add_argument("--max-memory-gb", type=_memory_gb,
                   help="memory limit per GPU in GB (1e9 bytes; default: the device's)")
    p.add_argument("--top", type=positive_int, default=5,
                   help="candidates to rank exactly and print (default 5)")
    p.add_argument("--micro-batch-sizes", type=_int_list, default=(1, 2, 4, 8),
                   metavar="LIST", help="micro-batch sizes to try (default 1,2,4,8)")
    p.add_argument("--schedules", type=_schedules, default=PLANNABLE_SCHEDULES,
                   metavar="LIST", help=f"schedules to try (default all searched: "
                                        f"{', '.join(PLANNABLE_SCHEDULES)})")
    p.add_argument("--json", metavar="PATH", help="write the funnel and the ranked "
                                                  "candidates as JSON")
    p.add_argument("--html", metavar="PATH", help="write a report page: the Pareto front "
                   "(tokens/s vs peak memory), the funnel, the winner's and runner-up's Gantt")
    add_backend_flags(p)  # where the replays run: --backend local|ray|dask, --jobs N


def cmd_plan(args: argparse.Namespace) -> int:
    topology_file = args.topology if Path(args.topology).exists() else None
    check_outputs({"--json": args.json, "--html": args.html},
                  {"--topology": topology_file})  # before the search
    space = SearchSpace(micro_batch_size=args.micro_batch_sizes, schedules=args.schedules)
    searches = {}  # GPU count -> (result, commands)
    for gpus in dict.fromkeys(args.gpus):
        if len(args.gpus) > 1:
            print(f"== {gpus} GPUs ==")
        searches[gpus] = run_plan(args.model, gpus, args.topology, args.global_batch_size,
                                  args.seq_length, args.max_memory_gb, args.top, space,
                                  n_jobs=args.jobs, backend=args.backend, dtype=args.dtype)
        print(format_report(*searches[gpus], args.top))
    found = all(result.candidates for result, _ in searches.values())
    if args.json:
        documents = {gpus: to_json(*found) for gpus, found in searches.items()}
        document = (next(iter(documents.values())) if len(documents) == 1 else
                    {"searches": [{"gpus": gpus, **d} for gpus, d in documents.items()]})
        write_text_atomic(args.json, json.dumps(document, indent=1))
    if args.html:
        from ..planner.html import write_plan_html  # here: plotly only when asked for
        largest = max(searches)  # the page's search; the others in the GPUs front
        result, commands = searches[largest]
        sweep = {gpus: found[0] for gpus, found in searches.items()}
        print(write_output(args.html, lambda path: write_plan_html(
            path, result, commands, load_topology(args.topology), top=args.top,
            sweep=sweep if len(sweep) > 1 else None)))
    return 0 if found else 1  # 1: a search found no layout that fits and runs


COMMANDS = {"plan": cmd_plan}
