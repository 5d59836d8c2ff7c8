"""The results table of `clustersim sweep`, written row by row as runs finish, and its
ranked summary. Units: seconds, tokens/s, GB (1e9 bytes); fractions in [0, 1].

Columns: `run` (the run's index in the sweep's product, so the file can be put back in
order), one column per swept flag, then METRICS, `status` (STATUSES) and `error` (one
line; empty when ok). `.csv` is written and flushed one row at a time, so it is readable
while the sweep runs and an interrupted sweep keeps every finished row. `.parquet` (or
`.pq`, through pyarrow, the `sweep` extra) is written in row groups of ROW_GROUP rows;
its footer comes last, so it is readable once the sweep ends (normally, on an error, or
on Ctrl-C; `close` runs in every case). Either is written in place, not through a
temporary file (schedules.output_files): streaming is the point.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from clustersim.schedules.errors import ConfigError

from .report import format_seconds

METRICS = ("iteration_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
           "bubble_fraction", "peak_memory_gb")
STATUSES = {"ok": "simulated", "oom": "simulated; peak memory above the device's",
            "error": "refused: the message names the flag and the rule",
            "crash": "an unexpected exception (a clustersim bug: please report it)"}
ROW_GROUP = 256  # rows per Parquet row group
KINDS = ("int", "float", "bool", "str")  # a swept column's type
PARQUET_SUFFIXES = (".parquet", ".pq")


def table_format(path: str) -> str:
    """'csv' or 'parquet' from the file name; ConfigError for another suffix."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise ConfigError(f"--out {path}: the table is written as .csv or .parquet (.pq); "
                      f"name the file so")


class TableWriter:
    """Rows in, a file out (module docstring). `columns`: the swept flags' names and
    KINDS, in order."""

    def __init__(self, path: str, columns: Sequence[tuple[str, str]]) -> None:
        self.path, self.format = path, table_format(path)
        self.names = ["run", *(name for name, _ in columns), *METRICS, "status", "error"]
        self.rows = 0
        if self.format == "csv":
            self.file = open(path, "w", newline="", encoding="utf-8")
            self.csv = csv.writer(self.file)
            self.csv.writerow(self.names)
            self.file.flush()
        else:
            pa = _pyarrow()
            import pyarrow.parquet as pq
            types = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
                     "str": pa.string()}
            self.schema = pa.schema([("run", pa.int64()),
                                     *((name, types[kind]) for name, kind in columns),
                                     *((name, pa.float64()) for name in METRICS),
                                     ("status", pa.string()), ("error", pa.string())])
            self.parquet = pq.ParquetWriter(path, self.schema)
            self.pending: list[dict] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows += 1
        if self.format == "csv":
            self.csv.writerow(["" if row.get(n) is None else _cell(row[n]) for n in self.names])
            self.file.flush()
            return
        self.pending.append(row)
        if len(self.pending) >= ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            import pyarrow as pa
            columns = {n: [row.get(n) for row in self.pending] for n in self.names}
            self.parquet.write_table(pa.Table.from_pydict(columns, schema=self.schema))
            self.pending = []

    def close(self) -> None:
        if self.format == "csv":
            self.file.close()
        else:
            self._flush()
            self.parquet.close()


def _cell(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)  # repr: every digit


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ConfigError("--out *.parquet needs pyarrow: pip install 'clustersim[sweep]' "
                          "(or write .csv)") from None
    return pyarrow


def ranked(rows: Sequence[dict]) -> list[dict]:
    """The rows that ran within memory, best first: by tokens/s per GPU (a sweep may change
    the batch, so iteration times need not compare, and the GPU count, so tokens/s alone
    would favour more GPUs; at one GPU count it orders as tokens/s), then tokens/s,
    iteration time, run."""
    done = [row for row in rows if row["status"] == "ok"]
    return sorted(done, key=lambda r: (-r["tokens_per_s_per_gpu"], -r["tokens_per_s"],
                                       r["iteration_time_s"], r["run"]))


def format_ranking(rows: Sequence[dict], columns: Sequence[str], top: int) -> str:
    """The top `top` of `ranked(rows)` as a terminal table."""
    best = ranked(rows)[:top]
    if not best:
        return "no run simulated within memory"
    body = [[i + 1, *(row[c] for c in columns), format_seconds(row["iteration_time_s"]),
             f"{row['tokens_per_s']:,.0f}", f"{row['tokens_per_s_per_gpu']:,.0f}",
             "n/a" if _missing(row["mfu"]) else f"{row['mfu']:.1%}",
             f"{row['bubble_fraction']:.4f}", f"{row['peak_memory_gb']:.1f} GB"]
            for i, row in enumerate(best)]
    return tabulate(body, headers=["rank", *columns, "iteration", "tokens/s", "per GPU", "MFU",
                                   "bubble", "peak mem"],
                    tablefmt="plain", disable_numparse=True)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def summary(rows: Sequence[dict], seconds: float) -> str:
    """'12 runs in 3.1 s: 10 ok, 1 oom, 1 error', then each error reason with its count
    (at most five), most frequent first."""
    counts = {status: sum(row["status"] == status for row in rows) for status in STATUSES}
    line = (f"{len(rows)} runs in {seconds:.1f} s: "
            + ", ".join(f"{n} {status}" for status, n in counts.items() if n))
    reasons: dict[str, int] = {}
    for row in rows:
        if row["status"] in ("error", "crash"):
            reasons[row["error"]] = reasons.get(row["error"], 0) + 1
    common = sorted(reasons.items(), key=lambda item: -item[1])[:5]
    return "\n".join([line, *(f"  {n} x {reason}" for reason, n in common)])
