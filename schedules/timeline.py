"""Timeline: what both backends emit, and the metrics computed from it alone.

A Timeline is one flat list of spans `(rank, lane, op, start, end)` plus memory samples
per rank. Times are seconds from the start of the iteration; memory in bytes. `source`
is `sim` or `kernels:<device>`.

Metrics (per rank r, T = iteration time = last end - first start; for an asynchronous
schedule, whose run is several batches with no flush, T is the steady-state window
`meta['steady_state']` (schedules.weight_stashing) and every time metric is computed over
the spans clipped to it; peaks of memory and in-flight microbatches are the run's):
- compute busy(r) = total duration of r's spans on the `compute` lane;
- idle(r) = T - busy(r): the time r does not compute, bubble and exposed communication;
- bubble fraction(r) = the time breakdown's 'bubble' of r / T: nothing of r in flight,
  neither compute nor communication (the pipeline bubble); `bubble_fraction` is the mean
  over ranks (for uniform costs, where communication is free, the classic (P-1)/(M+P-1)
  of GPipe/1F1B); exposed communication fraction(r) = the breakdown's exposed
  communication of r / T, reported beside the bubble, never inside it;
- peak in-flight microbatches(r) = the most (stage, microbatch) pairs whose forward has
  started and whose last backward op (B, or W after I) has not yet ended.
- time breakdown(r) (`time_breakdown`, issue 6): every instant of [start, start + T] on
  rank r goes to exactly one category, so the categories sum to T on every rank:
  'compute' while r's compute lane is busy; otherwise the first category, in
  EXPOSED_ORDER ('tp', 'cp', 'ep', 'pp', 'dp', 'other'), with a span of r in flight at
  that instant: that communication is EXPOSED (not overlapped by compute on that rank);
  'bubble' when nothing of r runs at all (idle: no op of r in progress). A
  span's category is its op's group axis ('tp', 'cp', 'ep', with the expert-TP 'etp' as
  'ep': MoE-layer communication; 'pp' and every SEND/RECV;
  'dp', 'dp_cp', 'dp_shard', 'dp_replicate', 'edp' and DualPipe's 'pp_copies' are 'dp');
  host copies and a host optimizer step are
  'other'. Priority: intra-layer groups first (the compute stream waits on them
  directly), then pipeline, then data-parallel traffic. A RECV's span starts when both
  ends are posted, so waiting for a peer that has not sent yet is bubble, not PP.

Reading (`Timeline.from_dict`, `Timeline.load`, what `clustersim compare` reads): every
field is type-checked and one ConfigError names the span (`spans[i].field`) and the rule:
`rank` an int >= 0, `lane` a non-empty string, `op` an action string (at most
MAX_OP_CHARS characters), `start`/`end` seconds with |t| <= MAX_ABS_SECONDS (1e9)
and end >= start, `nbytes` an integer >= 0, `flops` finite and >= 0, `count` an integer
>= 1, `group` null or a string, `info` null or an object; memory samples `[rank, seconds,
bytes]`. A file (`load`) is UTF-8 JSON of at most 256 MiB nested at most 64 deep
(`clustersim.user_files`) and holds at least one span.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from pathlib import Path
from typing import Any

from clustersim.user_files import is_finite_number, parse_json, read_text, short_repr

from .errors import ConfigError, ScheduleFormatError
from .frozen import fast_init
from .names import COMPUTE_LANE
from .ops import Op, parse_op
from .output_files import write_text_atomic
from .timeline_metrics import (CATEGORIES, EXPOSED_ORDER, category, peak_in_flight,
                               time_breakdown)

__all__ = ["CATEGORIES", "EXPOSED_ORDER", "MemorySample", "Span", "Timeline",
           "peak_in_flight", "span_category", "time_breakdown"]

_rank_of, _start_of, _end_of = attrgetter("rank"), attrgetter("start"), attrgetter("end")
# C-level readers for passes over a replay's millions of spans (the values a loop reads)
MAX_OP_CHARS = 64  # longest op string read ('12SEND_F345' is 11)
MAX_ABS_SECONDS = 1e9  # largest |time| read (s; ~32 years), so differences of times stay finite


def span_category(span: Span) -> str:
    """The time-breakdown category of `span` (module docstring)."""
    return category(span.lane, span.op)


@fast_init  # schedules.frozen: made by the million in a replay
@dataclass(frozen=True, slots=True)
class Span:
    """One op's execution on one rank's lane, in seconds. `info` holds extras for display
    (algorithm, achieved bandwidth, peer rank, ...)."""

    rank: int
    lane: str
    op: Op
    start: float
    end: float
    info: Mapping[str, Any] | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        d = {"rank": self.rank, "lane": self.lane, "op": str(self.op), "start": self.start,
             "end": self.end, "nbytes": self.op.nbytes, "flops": self.op.flops}
        if self.op.group is not None:
            d["group"] = self.op.group
        if self.op.count != 1:
            d["count"] = self.op.count
        if self.info:
            d["info"] = dict(self.info)
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any], where: str = "span") -> Span:
        """The span of `d` (`to_dict`'s form); ConfigError names `where`.field and the rule
        (module docstring, "Reading")."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: must be an object, got {type(d).__name__}")
        for key in ("rank", "lane", "op", "start", "end"):
            if key not in d:
                raise ConfigError(f"{where}.{key}: missing; rule: a span has rank, lane, op, "
                                  "start and end")
        text = d["op"]
        if not isinstance(text, str) or len(text) > MAX_OP_CHARS:
            raise ConfigError(f"{where}.op: must be an action string such as '0F1' of at "
                              f"most {MAX_OP_CHARS} characters, got {short_repr(text)}")
        try:
            op = parse_op(text)
        except ScheduleFormatError as exc:
            raise ConfigError(f"{where}.op: {exc}") from None
        group, info, lane = d.get("group"), d.get("info"), d["lane"]
        if group is not None and not isinstance(group, str):
            raise ConfigError(f"{where}.group: must be null or a group name such as 'dp', "
                              f"got {short_repr(group)}")
        if info is not None and not isinstance(info, Mapping):
            raise ConfigError(f"{where}.info: must be null or an object, got {short_repr(info)}")
        if not isinstance(lane, str) or not lane:
            raise ConfigError(f"{where}.lane: must be a non-empty string such as "
                              f"'{COMPUTE_LANE}', got {short_repr(lane)}")
        start, end = _seconds(where, "start", d["start"]), _seconds(where, "end", d["end"])
        if end < start:
            raise ConfigError(f"{where}: end {end!r} is before start {start!r}; rule: a span's "
                              "duration is >= 0 s")
        op = Op(op.kind, op.stage, op.microbatch, group,
                _number(where, "nbytes", d.get("nbytes", 0), 0, integer=True),
                _number(where, "flops", d.get("flops", 0.0), 0), op.chunk,
                _number(where, "count", d.get("count", 1), 1, integer=True))
        return Span(_rank(where, d["rank"]), lane, op, start, end, info)


@fast_init  # schedules.frozen: made by the million in a replay
@dataclass(frozen=True, slots=True)
class MemorySample:
    """Bytes allocated on `rank` from `time` on (a step function)."""

    rank: int
    time: float
    nbytes: int


@dataclass
class Timeline:
    spans: list[Span]
    memory: list[MemorySample] = field(default_factory=list)
    source: str = "sim"
    meta: dict[str, Any] = field(default_factory=dict)

    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False,
                                   compare=False)

    def _cached(self, name: str, compute: Callable[[], Any]) -> Any:
        """`compute()`, once per state of the spans, memory and window: the metrics read
        the same sweeps several times (summary, report, metrics JSON), and a deep
        pipeline has millions of spans. Spans and samples are immutable; appending or
        removing them, replacing the lists or changing the window starts afresh (writing
        a span over another in place, `spans[i] = s`, is not seen: build a new list)."""
        state = (id(self.spans), len(self.spans), id(self.memory), len(self.memory),
                 self.window)
        if self._cache.get("state") != state:
            self._cache.clear()
            self._cache["state"] = state
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    @property
    def ranks(self) -> list[int]:
        return list(self._cached("ranks", lambda: sorted(
            set(map(_rank_of, self.spans)).union(map(_rank_of, self.memory)))))

    @property
    def window(self) -> tuple[float, float] | None:
        """(start, end) seconds of the steady-state iteration of an asynchronous schedule
        (meta['steady_state'], schedules.weight_stashing), over which every time metric is
        computed; None: the iteration is the whole timeline."""
        steady = self.meta.get("steady_state")
        return (steady["start"], steady["end"]) if steady else None

    def _extent(self) -> tuple[float, float]:
        """(first start, last end) of all spans; (0, 0) without spans."""
        def compute() -> tuple[float, float]:
            spans = self.spans
            if not spans:
                return 0.0, 0.0
            return min(map(_start_of, spans)), max(map(_end_of, spans))
        return self._cached("extent", compute)

    @property
    def start_time(self) -> float:
        if self.window:
            return self.window[0]
        return self._extent()[0]

    @property
    def iteration_time(self) -> float:
        """Seconds from the first span's start to the last span's end (of the window)."""
        if self.window:
            return self.window[1] - self.window[0]
        return self._extent()[1] - self.start_time

    def window_spans(self) -> list[Span]:
        """The spans, clipped to the window (all of them when there is none)."""
        if not self.window:
            return self.spans
        start, end = self.window
        return [replace(s, start=max(s.start, start), end=min(s.end, end))
                for s in self.spans if s.end > start and s.start < end]

    def compute_busy(self) -> dict[int, float]:
        def compute() -> dict[int, float]:
            busy = dict.fromkeys(self.ranks, 0.0)
            for s in self.window_spans():
                if s.lane == COMPUTE_LANE:
                    busy[s.rank] += s.end - s.start
            return busy
        return dict(self._cached("compute_busy", compute))

    def idle_time(self) -> dict[int, float]:
        t = self.iteration_time
        return {r: t - b for r, b in self.compute_busy().items()}

    def bubble_fractions(self) -> dict[int, float]:
        """Per rank, the time with no op running over the iteration time."""
        return self._fractions(lambda row: row["bubble"])

    def exposed_comm_fractions(self) -> dict[int, float]:
        """Per rank, the time communication runs with no compute over the iteration time."""
        return self._fractions(lambda row: sum(row[c] for c in EXPOSED_ORDER))

    def _fractions(self, part: Callable[[dict[str, float]], float],
                   breakdown: Mapping[int, dict[str, float]] | None = None) -> dict[int, float]:
        t = self.iteration_time
        rows = self.time_breakdown() if breakdown is None else breakdown
        return {r: (part(row) / t if t > 0 else 0.0) for r, row in rows.items()}

    @property
    def bubble_fraction(self) -> float:
        """Mean over ranks of bubble_fractions."""
        return _mean(self.bubble_fractions())

    @property
    def exposed_comm_fraction(self) -> float:
        """Mean over ranks of exposed_comm_fractions."""
        return _mean(self.exposed_comm_fractions())

    def peak_memory(self) -> dict[int, int]:
        def compute() -> dict[int, int]:
            peak: dict[int, int] = {}
            for m in self.memory:
                peak[m.rank] = max(peak.get(m.rank, 0), m.nbytes)
            return peak
        return dict(self._cached("peak_memory", compute))

    def peak_memory_times(self) -> dict[int, float]:
        """Per rank, the first time (seconds) its memory reaches its peak."""
        def compute() -> dict[int, float]:
            peaks, times = self.peak_memory(), {}
            for m in self.memory:
                if m.rank not in times and m.nbytes == peaks[m.rank]:
                    times[m.rank] = m.time
            return times
        return dict(self._cached("peak_memory_times", compute))

    def peak_in_flight(self) -> dict[int, int]:
        return dict(self._cached("peak_in_flight", lambda: peak_in_flight(self.spans)))

    def time_breakdown(self) -> dict[int, dict[str, float]]:
        """Per rank, seconds per category of CATEGORIES; they sum to the iteration time
        (module docstring)."""
        rows = self._cached("time_breakdown", lambda: time_breakdown(
            self.window_spans(), self.ranks, self.start_time, self.iteration_time))
        return {r: dict(row) for r, row in rows.items()}

    def metrics(self) -> dict[str, Any]:
        """The metrics JSON: scalars plus per-rank values keyed by rank (as strings)."""
        def per_rank(values: Mapping[int, float]) -> dict[str, float]:
            return {str(r): v for r, v in sorted(values.items())}

        breakdown = self.time_breakdown()  # once: the fractions below are parts of it
        bubble = self._fractions(lambda row: row["bubble"], breakdown)
        exposed = self._fractions(lambda row: sum(row[c] for c in EXPOSED_ORDER), breakdown)
        return {
            "source": self.source,
            "iteration_time": self.iteration_time,
            "bubble_fraction": _mean(bubble),
            "exposed_comm_fraction": _mean(exposed),
            "time_breakdown": {  # seconds per rank; total = summed over ranks (rank-seconds)
                "categories": list(CATEGORIES),
                "per_rank": {str(r): v for r, v in sorted(breakdown.items())},
                "total": {c: sum(v[c] for v in breakdown.values()) for c in CATEGORIES},
            },
            "per_rank": {
                "compute_time": per_rank(self.compute_busy()),
                "idle_time": per_rank(self.idle_time()),
                "bubble_fraction": per_rank(bubble),
                "exposed_comm_fraction": per_rank(exposed),
                "peak_in_flight_microbatches": per_rank(self.peak_in_flight()),
                "peak_memory_bytes": per_rank(self.peak_memory()),
                "peak_memory_time": per_rank(self.peak_memory_times()),
            },
            **({"throughput": self.meta["throughput"]} if "throughput" in self.meta else {}),
            **({"meta": self.meta} if self.meta else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "meta": self.meta,
            "spans": [s.to_dict() for s in self.spans],
            "memory": [[m.rank, m.time, m.nbytes] for m in self.memory],
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Timeline:
        """The Timeline of `d` (`to_dict`'s form); one ConfigError names the first bad
        field and the rule (module docstring, "Reading")."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"top level: must be an object, got {type(d).__name__}")
        spans, memory = d.get("spans"), d.get("memory", [])
        source, meta = d.get("source", "sim"), d.get("meta", {})
        for key, value, kind in (("spans", spans, list), ("memory", memory, list),
                                 ("source", source, str), ("meta", meta, Mapping)):
            if not isinstance(value, kind):
                raise ConfigError(f"{key}: must be a JSON {_JSON_NAMES[kind]}, got "
                                  f"{short_repr(value)}")
        _check_window(meta.get("steady_state"))
        return Timeline([Span.from_dict(s, f"spans[{i}]") for i, s in enumerate(spans)],
                        [_memory_sample(f"memory[{i}]", m) for i, m in enumerate(memory)],
                        source, dict(meta))

    def save(self, path: str | Path) -> None:
        """Write the JSON file atomically (schedules.output_files)."""
        write_text_atomic(path, json.dumps(self.to_dict()))

    @staticmethod
    def load(path: str | Path) -> Timeline:
        """The Timeline in JSON file `path` (`save`, `--timeline-json`); every error is one
        ConfigError line naming the file, the field and the rule, also for no spans."""
        source = f"timeline {path}"
        data = parse_json(read_text(path, source, ConfigError), source, ConfigError)
        try:
            timeline = Timeline.from_dict(data)
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None
        if not timeline.spans:
            raise ConfigError(f"{source}: spans: empty; rule: a Timeline to compare holds at "
                              "least one span (write one with --timeline-json)")
        return timeline


_JSON_NAMES = {list: "list", str: "string", Mapping: "object"}


def _number(where: str, key: str, value: Any, minimum: float | None = None,
            integer: bool = False) -> Any:
    """`value` of field `where.key`: finite, >= `minimum` when given; an int when
    `integer` (an integral float is accepted), else a float."""
    if not is_finite_number(value) or (minimum is not None and value < minimum) \
            or (integer and value != int(value)):
        rule = ("an integer" if integer else "a finite number") + \
            ("" if minimum is None else f" >= {minimum:g}")
        raise ConfigError(f"{where}.{key}: must be {rule}, got {short_repr(value)}")
    return int(value) if integer else float(value)


def _seconds(where: str, key: str, value: Any) -> float:
    """A time of field `where.key`: finite, |value| <= MAX_ABS_SECONDS."""
    if not is_finite_number(value) or abs(value) > MAX_ABS_SECONDS:
        raise ConfigError(f"{where}.{key}: must be a finite number of seconds, at most "
                          f"{MAX_ABS_SECONDS:g} in size, got {short_repr(value)}")
    return float(value)


def _rank(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}.rank: must be an integer >= 0, got {short_repr(value)}")
    return value


def _memory_sample(where: str, item: Any) -> MemorySample:
    if not isinstance(item, (list, tuple)) or len(item) != 3:
        raise ConfigError(f"{where}: must be a [rank, seconds, bytes] list, got "
                          f"{short_repr(item)}")
    rank, time, nbytes = item
    return MemorySample(_rank(where, rank), _seconds(where, "seconds", time),
                        _number(where, "bytes", nbytes, 0, integer=True))


def _check_window(steady: Any) -> None:
    """meta.steady_state, when given: an object whose `start` and `end` are seconds with
    end > start."""
    if steady is None:
        return
    where = "meta.steady_state"
    if not isinstance(steady, Mapping):
        raise ConfigError(f"{where}: must be an object with start and end seconds, got "
                          f"{short_repr(steady)}")
    start, end = _seconds(where, "start", steady.get("start")), _seconds(where, "end",
                                                                            steady.get("end"))
    if not end > start:
        raise ConfigError(f"{where}: end {end!r} is not after start {start!r}; rule: the "
                          f"steady-state window lasts > 0 s")


def _mean(values: Mapping[int, float]) -> float:
    return sum(values.values()) / len(values) if values else 0.0
