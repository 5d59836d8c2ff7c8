"""Serving requests: a synthetic workload or a trace file. Units: seconds, tokens.

- `synthetic`: `num_prompts` requests of `input_len` prompt tokens and `output_len` output
  tokens, arriving as a Poisson process of `request_rate` requests/s (exponential gaps,
  seeded: vLLM's benchmark_serving.py with burstiness 1), all at time 0 when the rate is
  infinite (vLLM's default, and its offline throughput benchmark).
- `load_trace`: one request per row of a CSV (header `arrival_time,input_tokens,
  output_tokens`) or JSONL file (objects with those keys); arrival times in seconds,
  non-decreasing. A bad row is one ConfigError naming the file, the row and the field.
- `check_context`: refuses a request longer than the model's context.
"""
from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clustersim.schedules.errors import ConfigError

TRACE_FIELDS = ("arrival_time", "input_tokens", "output_tokens")
MAX_TRACE_BYTES = 256 << 20  # a trace file larger than this is refused before reading
MAX_REQUESTS = 1_000_000


@dataclass(frozen=True)
class Request:
    """One request: arrives at `arrival` (s) with `input_tokens` of prompt and asks for
    `output_tokens` (>= 1; the first comes out of the prefill)."""

    index: int
    arrival: float
    input_tokens: int
    output_tokens: int


def check_context(requests: Sequence[Request], context: int) -> None:
    """Refuse a request whose prompt and output exceed the model's `context` (seq_length,
    vLLM's max_model_len), as vLLM's server refuses it; ConfigError naming the request."""
    longest = max(requests, key=lambda r: r.input_tokens + r.output_tokens, default=None)
    if longest is not None and longest.input_tokens + longest.output_tokens > context:
        raise ConfigError(
            f"request {longest.index}: {longest.input_tokens} prompt + "
            f"{longest.output_tokens} output tokens exceed the model's context of "
            f"{context} tokens (seq_length, vLLM's max_model_len, which refuses such a "
            f"request); give a longer --seq-length if the model has one")


def _check_count(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def synthetic(num_prompts: int, input_len: int, output_len: int,
              request_rate: float = math.inf, seed: int = 0) -> list[Request]:
    """`num_prompts` equal requests, Poisson arrivals at `request_rate` (module docstring)."""
    _check_count("num_prompts", num_prompts)
    if num_prompts > MAX_REQUESTS:
        raise ConfigError(f"num_prompts must be at most {MAX_REQUESTS:,}, got {num_prompts:,}")
    _check_count("input_len", input_len)
    _check_count("output_len", output_len)
    if not (isinstance(request_rate, (int, float)) and request_rate > 0):
        raise ConfigError(f"request_rate must be > 0 requests/s (inf: all at once), got "
                          f"{request_rate!r}")
    rng, now, requests = random.Random(seed), 0.0, []
    for i in range(num_prompts):
        requests.append(Request(i, now, input_len, output_len))
        if math.isfinite(request_rate):
            now += rng.expovariate(request_rate)
    return requests


def load_trace(path: str | Path) -> list[Request]:
    """The requests of a CSV or JSONL trace (module docstring), in file order."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"trace {str(path)!r}: no such file")
    if path.stat().st_size > MAX_TRACE_BYTES:
        raise ConfigError(f"trace {str(path)!r}: larger than {MAX_TRACE_BYTES >> 20} MiB")
    text = path.read_text(encoding="utf-8", errors="strict")
    rows = _jsonl_rows(path, text) if path.suffix.lower() in (".jsonl", ".json") else \
        _csv_rows(path, text)
    if not rows:
        raise ConfigError(f"trace {str(path)!r}: no requests")
    if len(rows) > MAX_REQUESTS:
        raise ConfigError(f"trace {str(path)!r}: more than {MAX_REQUESTS:,} requests")
    requests, last = [], 0.0
    for i, (where, row) in enumerate(rows):
        arrival = _number(path, where, row, "arrival_time")
        if not math.isfinite(arrival) or arrival < last:
            raise ConfigError(f"trace {str(path)!r} {where}: arrival_time must be finite, "
                              f">= 0 and not before the previous row's, got {arrival!r}")
        tokens = [_number(path, where, row, f) for f in TRACE_FIELDS[1:]]
        for field, value in zip(TRACE_FIELDS[1:], tokens):
            if value != int(value) or value < 1:
                raise ConfigError(f"trace {str(path)!r} {where}: {field} must be an integer "
                                  f">= 1, got {value!r}")
        requests.append(Request(i, arrival, int(tokens[0]), int(tokens[1])))
        last = arrival
    return requests


def _csv_rows(path: Path, text: str) -> list[tuple[str, dict]]:
    reader = csv.DictReader(text.splitlines())
    missing = [f for f in TRACE_FIELDS if f not in (reader.fieldnames or ())]
    if missing:
        raise ConfigError(f"trace {str(path)!r}: CSV header must name "
                          f"{', '.join(TRACE_FIELDS)}; missing {', '.join(missing)}")
    return [(f"row {n}", row) for n, row in enumerate(reader, start=2)]


def _jsonl_rows(path: Path, text: str) -> list[tuple[str, dict]]:
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"trace {str(path)!r} line {n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"trace {str(path)!r} line {n}: must be an object with "
                              f"{', '.join(TRACE_FIELDS)}")
        rows.append((f"line {n}", row))
    return rows


def _number(path: Path, where: str, row: dict, field: str) -> float:
    value = row.get(field)
    try:
        number = float(value)  # CSV cells are strings
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or math.isnan(number):
        raise ConfigError(f"trace {str(path)!r} {where}: {field} must be a number, got "
                          f"{value!r}")
    return number
