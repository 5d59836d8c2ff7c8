"""`clustersim jobs JOBSFILE`: several jobs on one fabric (sim.shared_fabric): each job's
iteration time alone and together with the others, the slowdown, and the links where
they meet. Its parser (`add_parser`) and handler (`cmd_jobs`), registered in COMMANDS as
the other subcommand modules do.

The jobs file is YAML, TOML or JSON (sim.cli.config_reading), for example:

    topology: dgx-h100-x16-ndr   # simulate's --topology: a preset or a topology JSON
                                 # (a relative path: beside the jobs file first)
    fail_link: [nic3]            # optional: simulate's --slow-link / --fail-link
    jobs:
      - name: a                  # unique
        gpus: 0-7                # GPU indices of ranks 0, 1, ...: a list, or "0-3,8-11"
        model: llama3-8b         # then simulate's own flags, keyed by flag name
        tp: 2
        pp: 4
        microbatches: 8

Every key of a job but `name` and `gpus` is one of `simulate`'s flags, read through the
flag table as `--config` reads it (sim.cli.config_files.flag_tokens: one schema, each value
checked by its flag's own type and choices). A job replays every rank unless it sets
`replay`. What belongs to the whole fabric (topology, faults) is a top-level key; a run's
output files, a custom schedule CSV, the goodput flags, and cost models without the flow
network (uniform costs, a profile) are refused in a job, naming the key.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import networkx as nx

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.output_files import check_outputs, write_output, write_text_atomic
from clustersim.topologies import load_topology

from ..report import _table
from ..shared_fabric import Job, SharedFabricRun, simulate_jobs
from ..units import format_bytes, format_seconds
from .commands import add_parsers, schedule_and_parallel
from .config_files import _key, flag_tokens
from .config_reading import read_mapping
from .flags import cost_model_from_args, max_ops_from_args, model_from_args
from .replay_flags import faulted_topology, replaying_from_args

FABRIC_DESTS = ("topology", "slow_link", "fail_link")
"""simulate's flags that a jobs file sets once, at its top level, for the whole fabric."""
REFUSED_IN_A_JOB = {
    **{dest: "set it once for the whole fabric, at the top level of the jobs file"
       for dest in FABRIC_DESTS},
    **{dest: "a jobs run writes no per-job files (--json PATH writes the results)"
       for dest in ("output", "no_html", "trace_json", "metrics_json", "timeline_json",
                    "chakra_out", "schedule_out")},
    "schedule_csv": "a job runs a registered schedule (--schedule)",
    **{dest: "the goodput of a long run is simulate's, for one job" for dest in
       ("goodput", "gpu_mtbf_hours", "checkpoint_gbps", "restart_overhead_s",
        "checkpoint_every")},
    **{dest: "jobs meet on the topology's links, which only the roofline cost model uses"
       for dest in ("uniform_costs", "profile")},
}
"""simulate's flags a job may not set (dest -> the rule)."""
JOB_KEYS = ("name", "gpus")
SHOWN_LINKS = 20  # shared links printed; --json has them all


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "jobs", help="several jobs on one fabric: each one's iteration time alone and "
                     "together, and the links where they meet",
        description="Replay several jobs (models, layouts, GPUs) in one simulation on one "
                    "topology, sharing its links max-min fairly; print each job's "
                    "iteration time alone and together and the links that carried more "
                    "than one job's traffic. JOBSFILE: YAML, TOML or JSON with `topology` "
                    "and `jobs`, a list of {name, gpus, and simulate's flags as keys}.")
    p.add_argument("jobsfile", metavar="JOBSFILE", help="the jobs file (YAML, TOML, JSON)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")


def cmd_jobs(args: argparse.Namespace) -> int:
    check_outputs({"--json": args.json}, {"JOBSFILE": args.jobsfile})
    topology, jobs, topology_file = read_jobs(args.jobsfile)
    check_outputs({"--json": args.json}, {"JOBSFILE": args.jobsfile,
                                          "topology": topology_file})  # before the work
    run = simulate_jobs(jobs, topology)
    print(format_run(run))
    if args.json:
        print(write_output(args.json, lambda path: write_text_atomic(
            path, json.dumps(run.to_dict(), indent=1))))
    return 0


def read_jobs(path: str) -> tuple[nx.DiGraph, list[Job], str | None]:
    """The fabric (topology with its faults), the jobs of jobs file `path`, and the
    topology file read (None: a preset)."""
    sub = simulate_parser()
    data = read_mapping(path, "JOBSFILE")
    source = f"JOBSFILE {path}"
    fabric = {key: value for key, value in data.items() if key != "jobs"}
    for key in fabric:
        if _key(str(key)) not in FABRIC_DESTS:
            raise ConfigError(f"{source}: unknown key {key!r}; rule: the top level holds "
                              f"jobs, {', '.join(FABRIC_DESTS)}")
    args = _parse(sub, flag_tokens(sub, source, fabric))
    beside = Path(path).parent / args.topology  # a topology file beside the jobs file
    topology_file = (str(beside) if beside.is_file() else
                     args.topology if Path(args.topology).is_file() else None)
    topology = faulted_topology(load_topology(topology_file or args.topology), args)
    entries = data.get("jobs")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{source}: key 'jobs': a non-empty list of jobs, each a mapping "
                          f"with name, gpus and simulate's flags, got {_kind(entries)}")
    known = {_key(name) for action in sub._actions if action.option_strings
             for name in (*action.option_strings, action.dest)}
    return (topology, [_job(sub, source, i, entry, known) for i, entry in enumerate(entries)],
            topology_file)


def _job(sub: argparse.ArgumentParser, source: str, index: int, entry: Any,
         known: set[str]) -> Job:
    if not isinstance(entry, dict):
        raise ConfigError(f"{source}: jobs[{index}]: a mapping of keys to values, got "
                          f"{_kind(entry)}")
    name = entry.get("name", f"job{index}")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{source}: jobs[{index}]: key 'name': a non-empty string, got "
                          f"{name!r}")
    where = f"{source}: job {name!r}"
    if "gpus" not in entry:
        raise ConfigError(f"{where}: key 'gpus' is missing; rule: each job names its GPUs "
                          f"(indices, e.g. [0, 1, 2, 3] or \"0-3\")")
    flags = {key: value for key, value in entry.items() if key not in JOB_KEYS}
    for key, value in flags.items():
        if _key(str(key)) not in known:
            raise ConfigError(f"{where}: unknown key {key!r}; rule: a job's keys are name, "
                              f"gpus and simulate's flags without dashes (clustersim "
                              f"simulate --help)")
        refused = _dests(sub, flag_tokens(sub, where, {key: value}), REFUSED_IN_A_JOB)
        if refused:
            raise ConfigError(f"{where}: key {key!r} is not a job's; rule: "
                              f"{REFUSED_IN_A_JOB[refused.pop()]}")
    gpus = _gpus(entry["gpus"], f"{where}: key 'gpus'")
    args = _parse(sub, flag_tokens(sub, where, flags), replay=None)
    args.replay = args.replay or "all"  # the default of a job on a shared fabric
    try:
        model = model_from_args(args)
        _, parallel = schedule_and_parallel(args, model)
        return Job(name, model, parallel, gpus, cost_model_from_args(args),
                   replaying_from_args(args), max_ops_from_args(args))
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


class _RaisingParser(argparse.ArgumentParser):
    """A usage error raises ConfigError (a job's flags are checked, never exit)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


def simulate_parser() -> argparse.ArgumentParser:
    """`simulate`'s own parser (sim.cli.commands.add_parsers: the one flag table)."""
    sub = _RaisingParser(prog="clustersim").add_subparsers(dest="command")
    add_parsers(sub)
    return sub.choices["simulate"]


def _parse(sub: argparse.ArgumentParser, tokens: list[str], **preset: Any
           ) -> argparse.Namespace:
    """simulate's arguments from `tokens` (already checked one by one by flag_tokens);
    `preset`: dests left as given unless a token sets them (None: not given)."""
    return sub.parse_args(tokens, namespace=argparse.Namespace(**preset))


def _dests(sub: argparse.ArgumentParser, tokens: list[str], dests: Any) -> set[str]:
    """Which of `dests` the `tokens` set."""
    args = _parse(sub, tokens, **dict.fromkeys(dests))
    return {dest for dest in dests if getattr(args, dest) is not None}


_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


def _gpus(value: Any, where: str) -> tuple[int, ...]:
    """GPU indices from a list of integers or a string of indices and ranges ('0-3,8')."""
    rule = "a list of GPU indices ([0, 1, 2, 3]) or a string of indices and ranges ('0-3,8')"
    if isinstance(value, list) and all(isinstance(g, int) and not isinstance(g, bool)
                                       for g in value):
        return tuple(value)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {value!r} is not {rule}")
    gpus: list[int] = []
    for part in value.split(","):
        found = _RANGE.fullmatch(part)
        if found is None or (found[2] is not None and int(found[2]) < int(found[1])):
            raise ConfigError(f"{where}: {part.strip()!r} is not an index or a range a-b "
                              f"with a <= b; rule: {rule}")
        first, last = int(found[1]), int(found[2] or found[1])
        if last - first >= 1 << 20:
            raise ConfigError(f"{where}: range {part.strip()!r} is longer than any topology")
        gpus += range(first, last + 1)
    return tuple(gpus)


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def format_run(run: SharedFabricRun) -> str:
    """The jobs table, the shared links table, the notes and each job's warnings."""
    lines = [f"{len(run.jobs)} jobs on topology {run.topology!r}, one iteration each, "
             f"together in one simulation"]
    lines.append(_table(["job", "GPUs", "ranks", "alone", "together", "slowdown"], [
        [r.job.name, _ranges(r.job.gpus), r.job.parallel.world_size,
         format_seconds(r.alone.iteration_time), format_seconds(r.together.iteration_time),
         f"{r.slowdown:.4f}x"] for r in run.jobs]))
    if run.links:
        shown = run.links[:SHOWN_LINKS]
        lines.append(f"links where jobs meet ({len(run.links)} directed links, most contended "
                     f"first; busy: seconds with any flow, contended: with flows of two or "
                     f"more jobs):")
        lines.append(_table(["link", "kind", "bandwidth", "bytes by job", "busy",
                             "contended"], [
            [f"{s.src}->{s.dst}", s.kind, f"{s.bandwidth_Bps / 1e9:.4g} GB/s",
             ", ".join(f"{job} {format_bytes(n)}" for job, n in s.bytes_by_job.items()),
             format_seconds(s.busy_s), format_seconds(s.contended_s)] for s in shown]))
        if len(run.links) > len(shown):
            lines.append(f"... {len(run.links) - len(shown)} more links (all of them in "
                         f"--json)")
    else:
        lines.append("links where jobs meet: none (no link carried more than one job's "
                     "flows)")
    lines += [f"note: {note}" for note in run.notes]
    lines += [f"job {r.job.name!r}: warning: {w}" for r in run.jobs
              for w in r.together.meta.get("warnings", ())]
    return "\n".join(lines)


def _ranges(gpus: tuple[int, ...]) -> str:
    """'0-3,8' for GPU indices in the order given."""
    runs: list[list[int]] = []
    for g in gpus:
        if runs and g == runs[-1][1] + 1:
            runs[-1][1] = g
        else:
            runs.append([g, g])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


COMMANDS = {"jobs": cmd_jobs}
