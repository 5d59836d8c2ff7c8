"""`clustersim sweep`: simulate every combination of `simulate` flags given as lists or
ranges (`--tp 2,4,8 --microbatches 8..64x2`), in parallel (sim.backends: local cores
through joblib, or a Ray or Dask cluster), streaming one row per run to a CSV or Parquet
table (sim.sweep_table) as runs finish, under a progress bar; then the best runs
(sim.sweep_table.ranked: by tokens/s per GPU).

The parser takes simulate's own flags (commands.add_simulate_flags: one schema), each
re-registered to collect its raw text; sim.cli.sweep_runs expands them and checks every
value with the simulate parser. simulate's output flags (-o, --trace-json, ...) are
refused: a sweep writes one table; rerun a row with `clustersim simulate` for its files.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.output_files import check_outputs

from .. import progress
from ..backends import check_backend, open_backend
from ..sweep_table import METRICS, STATUSES, TableWriter, format_ranking, summary, table_format
from ..sweep_values import SYNTAX
from .backend_flags import add_backend_flags
from .config_files import add_config_flags
from .sweep_runs import build_axes, check_size, runs, simulate_parser, simulate_row

DEFAULT_MAX_RUNS = 1000
OUTPUT_DESTS = ("output", "no_html", "trace_json", "metrics_json", "chakra_out",
                "timeline_json", "schedule_out")
"""simulate's flags that write a run's files: refused by sweep (one table per sweep)."""
CONFIG_DESTS = ("config", "deepspeed_config", "torchtitan_config", "megatron_args")
INPUT_DESTS = {"schedule_csv": "--schedule-csv", "profile": "--profile",
               "gemm_table": "--gemm-table", "topology": "--topology"}
"""Flags that name files a run reads: the table may not overwrite one."""

DESCRIPTION = "\n\n".join([textwrap.fill(
    f"Simulate every combination of simulate's flags, each value of which may be {SYNTAX}; "
    f"switches sweep as --FLAG=on,off. Runs run in parallel (--backend, --jobs); each "
    f"finished run is one row of --out (a .csv is flushed row by row; a .parquet is "
    f"complete at the end), with columns run, the swept flags, {', '.join(METRICS)}, "
    f"status ({', '.join(STATUSES)}) and error. A run that fails is a row, not the end of "
    f"the sweep. Then the best runs (by tokens/s per GPU) are printed.", 88),
    "example: clustersim sweep --model gpt3-1.3b --topology dgx-a100 --pp 2 --tp 1,2,4 \\\n"
    "           --microbatches 4..32x2 --out sweep.csv"])


class _Collect(argparse.Action):
    """Records (simulate's action, the option string, the raw value) in `axes`."""

    def __init__(self, option_strings: Sequence[str], dest: str, source: argparse.Action,
                 **kw: Any) -> None:
        switch = source.nargs == 0
        metavar = "on,off" if switch else (source.metavar or _choices(source)
                                           or source.dest.upper())
        super().__init__(option_strings, dest="axes", default=None,
                         nargs="?" if switch else source.nargs, metavar=metavar,
                         help=source.help)
        self.source = source

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option: str | None = None) -> None:
        namespace.axes = [*(namespace.axes or []), (self.source, option, values)]


class _Refuse(argparse.Action):
    """A simulate output flag given to sweep: one error saying why."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?",
                         help=argparse.SUPPRESS)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option: str | None = None) -> None:
        parser.error(f"{option}: a sweep writes one table (--out PATH), not each run's "
                     f"files; rerun one row with `clustersim simulate {option} ...`")


def _choices(action: argparse.Action) -> str | None:
    if action.choices is None:
        return None
    return "{" + ",".join(map(str, action.choices)) + "}"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="simulate every combination of flags given as lists "
                                     "or ranges, in parallel, to a CSV/Parquet table",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("sweep")
    g.add_argument("--out", metavar="PATH", help="the results table, .csv or .parquet "
                   "(written as runs finish; without it only the ranking is printed)")
    add_backend_flags(g)
    g.add_argument("--max-runs", type=int, default=DEFAULT_MAX_RUNS, metavar="N",
                   help=f"refuse a sweep of more than N runs before running any "
                        f"(default {DEFAULT_MAX_RUNS:,})")
    g.add_argument("--top", type=int, default=10, metavar="N",
                   help="runs to print, best first by tokens/s per GPU (default 10)")
    groups: dict[str, Any] = {}
    for group in simulate_parser()._action_groups:
        for action in group._group_actions:
            if not action.option_strings or action.dest in CONFIG_DESTS:
                continue
            if action.dest in OUTPUT_DESTS:
                p.add_argument(*action.option_strings, action=_Refuse)
                continue
            title = f"simulate: {group.title}"
            target = groups.get(title) or groups.setdefault(title, p.add_argument_group(title))
            target.add_argument(*action.option_strings, action=_Collect, source=action)
    add_config_flags(p)


def _inputs(args: argparse.Namespace) -> dict[str, str]:
    """Every file a run may read, by flag (each value of a swept one)."""
    found = {}
    for i, (action, option, raw) in enumerate(args.axes or []):
        if action.dest in INPUT_DESTS and isinstance(raw, str):
            for j, text in enumerate(raw.split(",")):
                if text and Path(text).exists():
                    found[f"{INPUT_DESTS[action.dest]} ({i}.{j})"] = text
    return found


def cmd_sweep(args: argparse.Namespace) -> int:
    check_backend(args.backend, args.jobs)
    if args.max_runs < 1 or args.top < 1:
        raise ConfigError("--max-runs and --top must be integers >= 1")
    if args.out is not None:
        table_format(args.out)
        check_outputs({"--out": args.out}, _inputs(args))
    axes = build_axes(args.axes or [], args.max_runs)
    total = check_size(axes, args.max_runs)
    todo = runs(axes)
    columns = [(axis.column, axis.kind) for axis in axes if axis.swept]
    fixed = " ".join(" ".join(axis.tokens[0]) for axis in axes if not axis.swept)
    swept = ", ".join(f"{axis.flag} {len(axis.values)}" for axis in axes if axis.swept)
    print(f"sweep: {total:,} run(s)" + (f" ({swept})" if swept else "")
          + (f"; every run: {fixed}" if fixed else ""))
    writer = TableWriter(args.out, columns) if args.out else None
    rows: list[dict] = []
    started = time.perf_counter()
    try:
        with open_backend(args.backend, args.jobs) as backend:
            if backend.name == "local":  # a cluster's backend said where (progress.note)
                print(f"on {backend.where}")
            calls = [(tokens,) for _, tokens in todo]
            with _Bar(total) as bar:
                for index, outcome in backend.imap_unordered(simulate_row, calls):
                    row = {"run": index, **todo[index][0], **outcome}
                    rows.append(row)
                    if writer is not None:
                        writer.write(row)
                    bar.update(row["status"])
    finally:
        if writer is not None:
            writer.close()
    print(format_ranking(rows, [name for name, _ in columns], args.top))
    print(summary(rows, time.perf_counter() - started))
    if writer is not None:
        print(f"wrote {args.out} ({writer.rows} rows)")
    if rows and all(row["status"] in ("error", "crash") for row in rows):
        raise ConfigError(f"every run failed; the first: {rows[0]['error']}")
    return 0


class _Bar:
    """The sweep's progress: a tqdm bar on a terminal; on a log, a status line every
    progress.STATUS_EVERY seconds. tqdm: already the replay's bar (sim.progress), pure
    Python without dependencies, and it draws on any terminal or notebook; rich would
    add a dependency tree for one bar."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.bar: Any = None
        self.started = self.last = time.perf_counter()

    def __enter__(self) -> "_Bar":
        if sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=self.total, desc="sweep", unit="run", file=sys.stderr)
        return self

    def update(self, status: str) -> None:
        self.done += 1
        self.failed += status in ("error", "crash")
        if self.bar is not None:
            self.bar.set_postfix(failed=self.failed, refresh=False)
            self.bar.update(1)
            return
        now = time.perf_counter()
        if now - self.last >= progress.STATUS_EVERY:
            self.last = now
            print(f"clustersim: sweep: {self.done:,} of {self.total:,} runs, "
                  f"{self.failed:,} failed, {now - self.started:.0f} s",
                  file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


COMMANDS = {"sweep": cmd_sweep}
