"""Chrome/Perfetto trace JSON of a Timeline (open it at https://ui.perfetto.dev).

Units: `ts` and `dur` in microseconds on a whole-nanosecond grid (span seconds * 1e6, same
origin as the Timeline; see "Nesting"); memory counters in GB (1e9 bytes).

Mapping: process (`pid`) = rank, named `rank N`; thread (`tid`) = a track of a lane,
named by `thread_name` metadata, lanes in the Gantt chart's order. Chrome and Perfetto nest
the complete events of one thread and cannot draw two that overlap without one holding the
other (two transfers of one lane in flight at once), so a lane's spans are laid out on as
few tracks as keep every track's spans apart (interval partitioning, greedy by start):
track 0 keeps the lane's name, the others are named `lane #2`, `lane #3`. Each span is a
complete event (`ph: "X"`) named by its op text (`2F0`) with the op kind as category;
memory samples are counter events (`ph: "C"`, name `memory`); every P2P transfer is a flow
arrow (`ph: "s"` on the send, `ph: "f"`, `bp: "e"` on the matching receive). Flow ends
sit at the middle of their slices so each binds to its own slice unambiguously.

Nesting: Perfetto reads `ts` and `dur` as llround(µs * 1000) nanoseconds each
(perfetto src/trace_processor/importers/json/json_trace_parser_impl.cc, CoerceToTs), so a
slice that ends exactly where the next one of its track starts would, written as
start * 1e6 and duration * 1e6, end up to 1 ns after that start and overlap it partially.
Every span's start and end are therefore rounded to whole nanoseconds first (rounding is
monotonic, so spans apart or nested in seconds stay so) and `dur` is the difference;
`nesting_violations` checks a trace as Perfetto reads it.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clustersim.schedules.names import (COMPUTE_LANE, CP, DP, DP_CP, DP_REPLICATE, DP_SHARD,
                                        EDP, EP, ETP, HOST_LANE, PCIE_LANE, PP, RECV_LANE,
                                        SEND_LANE, TP)
from clustersim.schedules.ops import OpKind
from clustersim.schedules.output_files import write_text_atomic
from clustersim.schedules.timeline import Span, Timeline

US_PER_S = 1e6
NS_PER_US = 1000
TRACKS_PER_LANE = 1000  # tid = lane index * TRACKS_PER_LANE + track
LANE_ORDER = (COMPUTE_LANE, SEND_LANE, RECV_LANE, PP, TP, CP, EP, ETP, DP, DP_CP, DP_SHARD,
              DP_REPLICATE, EDP, PCIE_LANE, HOST_LANE)

# A send's receiver holds the next stage for activations, the previous one for gradients.
_RECEIVER = {OpKind.SEND_F: (OpKind.RECV_F, +1), OpKind.SEND_B: (OpKind.RECV_B, -1)}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


_SCALARS = (type(None), bool, int, float, str)


def _jsonable_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """A span's info as JSON reads it back: the info itself when it holds JSON scalars
    under string keys (a P2P span's peer and bandwidth; what `_jsonable` would return),
    else through `_jsonable`."""
    if all(type(k) is str and type(v) in _SCALARS for k, v in info.items()):
        return dict(info)
    return _jsonable(dict(info))


def lane_ids(timeline: Timeline) -> dict[str, int]:
    """Integer thread id per lane: known lanes in display order, then the rest by name."""
    lanes = {s.lane for s in timeline.spans}
    known = [lane for lane in LANE_ORDER if lane in lanes]
    return {lane: i for i, lane in enumerate(known + sorted(lanes - set(known)))}


def p2p_pairs(timeline: Timeline) -> list[tuple[Span, Span]]:
    """(send, receive) span pairs: SEND_F(s,m) with RECV_F(s+1,m), SEND_B(s,m) with
    RECV_B(s-1,m). Where replicas repeat a key, sends and receives pair in rank order."""
    recvs: dict[tuple, list[Span]] = defaultdict(list)
    sends: dict[tuple, list[Span]] = defaultdict(list)
    for s in timeline.spans:
        op = s.op
        if op.kind in _RECEIVER:
            kind, step = _RECEIVER[op.kind]
            sends[(kind, op.stage + step, op.microbatch)].append(s)
        elif op.kind in (OpKind.RECV_F, OpKind.RECV_B):
            recvs[(op.kind, op.stage, op.microbatch)].append(s)
    pairs = []
    for key, send_spans in sends.items():
        order = sorted(recvs.get(key, []), key=lambda s: (s.rank, s.start))
        pairs.extend(zip(sorted(send_spans, key=lambda s: (s.rank, s.start)), order))
    return sorted(pairs, key=lambda p: p[0].start)


def span_tracks(timeline: Timeline) -> dict[int, int]:
    """id(span) -> its thread id: the lane's index (lane_ids) * TRACKS_PER_LANE plus the
    first track of its (rank, lane) whose previous span has ended (module docstring)."""
    lanes = lane_ids(timeline)
    ends: dict[tuple[int, str], list[float]] = defaultdict(list)  # track -> its last end
    tids = {}
    for span in sorted(timeline.spans, key=lambda s: (s.start, s.end)):
        tracks = ends[(span.rank, span.lane)]
        track = next((i for i, end in enumerate(tracks) if end <= span.start), len(tracks))
        if track == len(tracks):
            tracks.append(span.end)
        tracks[track] = span.end
        tids[id(span)] = lanes[span.lane] * TRACKS_PER_LANE + track
    return tids


def _metadata(timeline: Timeline, tracks: dict[int, int]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    names = {index: lane for lane, index in lane_ids(timeline).items()}
    used = defaultdict(set)
    for s in timeline.spans:
        used[s.rank].add(tracks[id(s)])
    for rank in timeline.ranks:
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        for tid in sorted(used[rank]):
            lane, track = divmod(tid, TRACKS_PER_LANE)
            name = names[lane] + (f" #{track + 1}" if track else "")
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                           "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                           "args": {"sort_index": tid}})
    return events


def _span_event(span: Span, tid: int) -> dict[str, Any]:
    op = span.op
    args: dict[str, Any] = {"stage": op.stage, "microbatch": op.microbatch,
                            "bytes": op.nbytes, "flops": op.flops}
    if op.group:
        args["group"] = op.group
    if span.info:
        args.update(_jsonable_info(span.info))
    start, end = _ns(span.start), _ns(span.end)
    return {"ph": "X", "name": str(op), "cat": op.kind.value, "pid": span.rank, "tid": tid,
            "ts": start / NS_PER_US, "dur": (end - start) / NS_PER_US, "args": args}


def _ns(seconds: float) -> int:
    """`seconds` as whole nanoseconds (module docstring, "Nesting")."""
    return round(seconds * US_PER_S * NS_PER_US)


def _middle_us(span: Span) -> float:
    """The middle of `span`'s slice in µs, on the nanosecond grid, so it lies in the slice."""
    return (_ns(span.start) + _ns(span.end)) // 2 / NS_PER_US


def _flow_events(timeline: Timeline, tracks: dict[int, int]) -> list[dict[str, Any]]:
    events = []
    for flow_id, (send, recv) in enumerate(p2p_pairs(timeline)):
        common = {"name": f"{send.op}→{recv.op}", "cat": "p2p", "id": flow_id}
        events.append({"ph": "s", "pid": send.rank, "tid": tracks[id(send)],
                       "ts": _middle_us(send), **common})
        events.append({"ph": "f", "bp": "e", "pid": recv.rank, "tid": tracks[id(recv)],
                       "ts": _middle_us(recv), **common})
    return events


def chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """The trace as a JSON-serialisable dict: `{"traceEvents": [...], ...}`."""
    tracks = span_tracks(timeline)
    events = _metadata(timeline, tracks)
    events.extend(_span_event(s, tracks[id(s)]) for s in timeline.spans)
    events.extend({"ph": "C", "name": "memory", "pid": m.rank, "ts": m.time * US_PER_S,
                   "args": {"GB": m.nbytes / 1e9}} for m in timeline.memory)
    events.extend(_flow_events(timeline, tracks))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": _jsonable({"source": timeline.source, **timeline.meta})}


def write_trace(timeline: Timeline, path: str | Path) -> Path:
    """Write the Chrome/Perfetto trace JSON file (atomically); returns its path."""
    return write_text_atomic(path, json.dumps(chrome_trace(timeline), separators=(",", ":")))


def perfetto_ns(microseconds: float) -> int:
    """A JSON `ts` or `dur` (µs) as Perfetto stores it: llround(µs * 1000) nanoseconds, half
    away from zero (module docstring, "Nesting")."""
    return int(math.copysign(math.floor(abs(microseconds) * NS_PER_US + 0.5), microseconds))


def nesting_violations(trace: dict[str, Any]) -> list[str]:
    """The complete events (`ph: "X"`) of `trace` that break Perfetto's rule for the slices
    of one thread (pid, tid): any two are disjoint or one holds the other. Times as
    Perfetto reads them (`perfetto_ns`); one line per slice that overlaps an open one
    partially, naming both. Empty: every slice nests."""
    threads: dict[tuple, list[tuple[int, int, str]]] = defaultdict(list)
    for event in trace["traceEvents"]:
        if event.get("ph") == "X":
            start = perfetto_ns(event["ts"])
            threads[(event["pid"], event["tid"])].append(
                (start, -(start + perfetto_ns(event["dur"])), event["name"]))
    problems = []
    for (pid, tid), slices in threads.items():
        open_slices: list[tuple[int, str]] = []  # (end ns, name), innermost last
        for start, neg_end, name in sorted(slices):  # by start, the longer one first
            while open_slices and open_slices[-1][0] <= start:
                open_slices.pop()
            if open_slices and -neg_end > open_slices[-1][0]:
                outer_end, outer = open_slices[-1]
                problems.append(f"pid {pid} tid {tid}: {name} [{start}, {-neg_end}] ns "
                                f"starts inside {outer} (ends {outer_end} ns) and ends after it")
            open_slices.append((-neg_end, name))
    return problems
