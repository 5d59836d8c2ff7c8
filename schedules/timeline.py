"""Timeline: what both backends emit, and the metrics computed from it alone.

A Timeline is one flat list of spans `(rank, lane, op, start, end)` plus memory samples
per rank. Times are seconds from the start of the iteration; memory in bytes. `source`
is `sim` or `kernels:<device>`.

Metrics (per rank r, T = iteration time = last end - first start):
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
  'bubble' when nothing of r runs at all (idle, waiting with nothing in flight). A
  span's category is its op's group axis ('tp', 'cp', 'ep', with the expert-TP 'etp' as
  'ep': MoE-layer communication; 'pp' and every SEND/RECV;
  'dp', 'dp_cp', 'dp_shard', 'dp_replicate', 'edp' are 'dp'); host copies and a host optimizer step are
  'other'. Priority: intra-layer groups first (the compute stream waits on them
  directly), then pipeline, then data-parallel traffic. A RECV's span starts when both
  ends are posted, so waiting for a peer that has not sent yet is bubble, not PP.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .names import COMPUTE_LANE, CP, DP, DP_CP, DP_REPLICATE, DP_SHARD, EDP, EP, ETP, PP, TP
from .ops import Op, OpKind, parse_op

EXPOSED_ORDER = (TP, CP, EP, PP, DP, "other")
CATEGORIES = ("compute", *EXPOSED_ORDER, "bubble")
_GROUP_CATEGORY = {TP: TP, CP: CP, EP: EP, ETP: EP, PP: PP, DP: DP, DP_CP: DP, DP_SHARD: DP,
                   DP_REPLICATE: DP, EDP: DP}


def span_category(span: Span) -> str:
    """The time-breakdown category of `span` (module docstring)."""
    if span.lane == COMPUTE_LANE:
        return "compute"
    if span.op.kind.is_p2p:
        return PP
    return _GROUP_CATEGORY.get(span.op.group or "", "other")


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
    def from_dict(d: Mapping[str, Any]) -> Span:
        op = parse_op(d["op"])
        op = Op(op.kind, op.stage, op.microbatch, d["group"] if "group" in d else None,
                int(d.get("nbytes", 0)), float(d.get("flops", 0.0)), op.chunk,
                int(d.get("count", 1)))
        return Span(int(d["rank"]), d["lane"], op, float(d["start"]), float(d["end"]),
                    d.get("info"))


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

    @property
    def ranks(self) -> list[int]:
        return sorted({s.rank for s in self.spans} | {m.rank for m in self.memory})

    @property
    def start_time(self) -> float:
        return min((s.start for s in self.spans), default=0.0)

    @property
    def iteration_time(self) -> float:
        """Seconds from the first span's start to the last span's end."""
        return max((s.end for s in self.spans), default=0.0) - self.start_time

    def compute_busy(self) -> dict[int, float]:
        busy = dict.fromkeys(self.ranks, 0.0)
        for s in self.spans:
            if s.lane == COMPUTE_LANE:
                busy[s.rank] += s.duration
        return busy

    def idle_time(self) -> dict[int, float]:
        t = self.iteration_time
        return {r: t - b for r, b in self.compute_busy().items()}

    def bubble_fractions(self) -> dict[int, float]:
        """Per rank, the time with nothing in flight over the iteration time."""
        return self._fractions(lambda row: row["bubble"])

    def exposed_comm_fractions(self) -> dict[int, float]:
        """Per rank, the time communication runs with no compute over the iteration time."""
        return self._fractions(lambda row: sum(row[c] for c in EXPOSED_ORDER))

    def _fractions(self, part: Callable[[dict[str, float]], float]) -> dict[int, float]:
        t = self.iteration_time
        return {r: (part(row) / t if t > 0 else 0.0) for r, row in self.time_breakdown().items()}

    @property
    def bubble_fraction(self) -> float:
        """Mean over ranks of bubble_fractions."""
        return _mean(self.bubble_fractions())

    @property
    def exposed_comm_fraction(self) -> float:
        """Mean over ranks of exposed_comm_fractions."""
        return _mean(self.exposed_comm_fractions())

    def peak_memory(self) -> dict[int, int]:
        peak: dict[int, int] = {}
        for m in self.memory:
            peak[m.rank] = max(peak.get(m.rank, 0), m.nbytes)
        return peak

    def peak_memory_times(self) -> dict[int, float]:
        """Per rank, the first time (seconds) its memory reaches its peak."""
        peaks, times = self.peak_memory(), {}
        for m in self.memory:
            if m.rank not in times and m.nbytes == peaks[m.rank]:
                times[m.rank] = m.time
        return times

    def peak_in_flight(self) -> dict[int, int]:
        return peak_in_flight(self.spans)

    def time_breakdown(self) -> dict[int, dict[str, float]]:
        """Per rank, seconds per category of CATEGORIES; they sum to the iteration time
        (module docstring)."""
        return time_breakdown(self.spans, self.ranks, self.start_time, self.iteration_time)

    def metrics(self) -> dict[str, Any]:
        """The metrics JSON: scalars plus per-rank values keyed by rank (as strings)."""
        def per_rank(values: Mapping[int, float]) -> dict[str, float]:
            return {str(r): v for r, v in sorted(values.items())}

        breakdown = self.time_breakdown()
        return {
            "source": self.source,
            "iteration_time": self.iteration_time,
            "bubble_fraction": self.bubble_fraction,
            "exposed_comm_fraction": self.exposed_comm_fraction,
            "time_breakdown": {  # seconds per rank; total = summed over ranks (rank-seconds)
                "categories": list(CATEGORIES),
                "per_rank": {str(r): v for r, v in sorted(breakdown.items())},
                "total": {c: sum(v[c] for v in breakdown.values()) for c in CATEGORIES},
            },
            "per_rank": {
                "compute_time": per_rank(self.compute_busy()),
                "idle_time": per_rank(self.idle_time()),
                "bubble_fraction": per_rank(self.bubble_fractions()),
                "exposed_comm_fraction": per_rank(self.exposed_comm_fractions()),
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
        return Timeline(
            [Span.from_dict(s) for s in d["spans"]],
            [MemorySample(int(r), float(t), int(b)) for r, t, b in d.get("memory", [])],
            d.get("source", "sim"),
            dict(d.get("meta", {})),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @staticmethod
    def load(path: str | Path) -> Timeline:
        return Timeline.from_dict(json.loads(Path(path).read_text()))


def _mean(values: Mapping[int, float]) -> float:
    return sum(values.values()) / len(values) if values else 0.0


def peak_in_flight(spans: Iterable[Span],
                   weight: Callable[[Op], float] | None = None) -> dict[int, float]:
    """Per rank, the most microbatch-stages held at once: (stage, microbatch) is held from
    the start of its first forward span to the end of its last backward span (B, or W
    after I; an I without W ends it), so layer-group chunks of one op count once. With
    `weight`, the most of their summed weight(forward op) instead (e.g. activation bytes)."""
    spans = list(spans)
    split_backward = {(s.op.stage, s.op.microbatch) for s in spans if s.op.kind is OpKind.W}
    held: dict[tuple[int, int, int | None], list] = {}  # (rank, s, m) -> [start, end, op]
    for s in spans:
        kind, key = s.op.kind, (s.op.stage, s.op.microbatch)
        entry = held.setdefault((s.rank, *key), [None, None, s.op])
        if kind is OpKind.F:
            if entry[0] is None or s.start < entry[0]:
                entry[0], entry[2] = s.start, s.op
        elif kind is OpKind.B or kind is OpKind.W or (
            kind is OpKind.I and key not in split_backward
        ):
            entry[1] = s.end if entry[1] is None else max(entry[1], s.end)
    events: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for (rank, _, _), (start, end, op) in held.items():
        amount = 1 if weight is None else weight(op)
        if start is not None:
            events[rank].append((start, amount))
            if end is not None:
                events[rank].append((end, -amount))
    peaks = {}
    for rank, evs in events.items():
        evs.sort(key=lambda e: (e[0], e[1]))  # releases before acquisitions at equal times
        level = peak = 0
        for _, delta in evs:
            level += delta
            peak = max(peak, level)
        peaks[rank] = peak
    return peaks


def time_breakdown(spans: Iterable[Span], ranks: Iterable[int], start: float,
                   total: float) -> dict[int, dict[str, float]]:
    """Per rank, seconds of [start, start + total] in each of CATEGORIES: a sweep over the
    rank's span edges; between two edges the active category of highest priority
    (compute, then EXPOSED_ORDER) takes the time, and time with none is bubble."""
    priority = {c: i for i, c in enumerate(CATEGORIES[:-1])}
    edges: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
    for s in spans:
        if s.end > s.start:
            p = priority[span_category(s)]
            edges[s.rank].append((s.start, 1, p))
            edges[s.rank].append((s.end, -1, p))
    out = {}
    for rank in ranks:
        seconds = [0.0] * len(priority)
        active = [0] * len(priority)
        events = sorted(edges.get(rank, ()))
        for (time, delta, p), nxt in zip(events, events[1:] + [None]):
            active[p] += delta
            if nxt is not None and nxt[0] > time:
                top = next((i for i, n in enumerate(active) if n > 0), None)
                if top is not None:
                    seconds[top] += nxt[0] - time
        row = dict(zip(CATEGORIES, seconds))
        row["bubble"] = max(total - sum(seconds), 0.0)
        out[rank] = row
    return out
