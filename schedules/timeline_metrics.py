"""The per-rank sweeps behind Timeline's metrics (schedules.timeline's docstring defines
them): the time-breakdown category of a span, the time breakdown and the peak of
microbatch-stages in flight. Seconds; weights in the caller's unit.

Each sweep visits a span once and keeps per-span work to a dictionary look-up: a span's
category is found once per (lane, op kind, group), not per span. The floating-point
operations are those of the definitions, in the same order (a rank's intervals in time
order), so the results are the same to the last bit.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from itertools import pairwise

from .names import (COMPUTE_LANE, CP, DP, DP_CP, DP_DEP, DP_REPLICATE, DP_SHARD, EDP, EP,
                    ETP, PP, PP_COPIES, TP, TP_GRID_GROUPS)
from .ops import Op, OpKind

EXPOSED_ORDER = (TP, CP, EP, PP, DP, "other")
CATEGORIES = ("compute", *EXPOSED_ORDER, "bubble")
_GROUP_CATEGORY = {TP: TP, CP: CP, EP: EP, ETP: EP, PP: PP, DP: DP, DP_CP: DP, DP_SHARD: DP,
                   DP_REPLICATE: DP, EDP: DP, PP_COPIES: DP, DP_DEP: DP,
                   **dict.fromkeys(TP_GRID_GROUPS, TP)}
_PRIORITY = {c: i for i, c in enumerate(CATEGORIES[:-1])}  # compute first, then exposed


def category(lane: str, op: Op) -> str:
    """The time-breakdown category of a span of `op` on `lane` (module docstring of
    schedules.timeline)."""
    if lane == COMPUTE_LANE:
        return "compute"
    if op.kind.is_p2p:
        return PP
    return _GROUP_CATEGORY.get(op.group or "", "other")


def time_breakdown(spans: Iterable, ranks: Iterable[int], start: float,
                   total: float) -> dict[int, dict[str, float]]:
    """Per rank, seconds of [start, start + total] in each of CATEGORIES: a sweep over the
    rank's span edges; between two edges the active category of highest priority
    (compute, then EXPOSED_ORDER) takes the time, and time with none is bubble. The edges
    of one rank exist at a time."""
    by_rank: dict[int, list] = defaultdict(list)
    for s in spans:
        by_rank[s.rank].append(s)
    priority: dict[tuple, int] = {}
    return {rank: _sweep(_edges(by_rank.get(rank, ()), priority), total) for rank in ranks}


def _edges(spans: Iterable, priority: dict[tuple, int]) -> list[tuple[float, int, int]]:
    """(time, +1 start / -1 end, category priority) of every span of positive length,
    sorted; `priority` caches each (lane, kind, group)'s."""
    edges: list[tuple[float, int, int]] = []
    append = edges.append
    for s in spans:
        begin, end = s.start, s.end
        if end > begin:
            op = s.op
            key = (s.lane, op.kind, op.group)
            p = priority.get(key)
            if p is None:
                p = priority[key] = _PRIORITY[category(s.lane, op)]
            append((begin, 1, p))
            append((end, -1, p))
    edges.sort()
    return edges


def _sweep(events: list[tuple[float, int, int]], total: float) -> dict[str, float]:
    """One rank's breakdown from its sorted edges (time_breakdown)."""
    n = len(_PRIORITY)
    seconds, active = [0.0] * n, [0] * n
    levels = range(n)
    for (time, delta, p), (following, _, _) in pairwise(events):  # no copy of the list
        active[p] += delta
        if following > time:
            for top in levels:
                if active[top] > 0:
                    seconds[top] += following - time
                    break
    row = dict(zip(CATEGORIES, seconds))
    row["bubble"] = max(total - sum(seconds), 0.0)
    return row


_RELEASES = (OpKind.B, OpKind.W)


def peak_in_flight(spans: Iterable, weight: Callable[[Op], float] | None = None
                   ) -> dict[int, float]:
    """Per rank, the most microbatch-stages held at once: (stage, microbatch) is held from
    the start of its first forward span to the end of its last backward span (B, or W
    after I; an I without W ends it), so layer-group chunks of one op count once. With
    `weight`, the most of their summed weight(forward op) instead (e.g. activation bytes).
    Spans of other kinds hold nothing and are skipped; one rank is swept at a time."""
    by_rank: dict[int, list] = defaultdict(list)
    for s in spans:
        if s.op.kind in _WORK:
            by_rank[s.rank].append(s)
    split_backward = {(s.op.stage, s.op.microbatch) for work in by_rank.values()
                      for s in work if s.op.kind is OpKind.W}
    peaks = {}
    for rank, work in by_rank.items():
        events = _holds(work, split_backward, weight)
        if events:
            peaks[rank] = _peak(events)
    return peaks


def _holds(work: list, split_backward: set, weight: Callable[[Op], float] | None
           ) -> list[tuple[float, float]]:
    """One rank's (time, +amount when a microbatch-stage is taken, -amount when freed),
    sorted (peak_in_flight)."""
    f, i = OpKind.F, OpKind.I
    held: dict[tuple[int, int | None], list] = {}  # (s, m) -> [start, end, forward op]
    for s in work:
        op = s.op
        kind = op.kind
        entry = held.get((op.stage, op.microbatch))
        if entry is None:
            entry = held[(op.stage, op.microbatch)] = [None, None, op]
        if kind is f:
            if entry[0] is None or s.start < entry[0]:
                entry[0], entry[2] = s.start, op
        elif kind in _RELEASES or (kind is i and (op.stage, op.microbatch)
                                   not in split_backward):
            entry[1] = s.end if entry[1] is None else max(entry[1], s.end)
    events: list[tuple[float, float]] = []
    for begin, end, op in held.values():
        amount = 1 if weight is None else weight(op)
        if begin is not None:
            events.append((begin, amount))
            if end is not None:
                events.append((end, -amount))
    events.sort()  # by time, releases (negative) before acquisitions at equal times
    return events


def _peak(events: list[tuple[float, float]]) -> float:
    level = peak = 0
    for _, delta in events:
        level += delta
        if level > peak:
            peak = level
    return peak


_WORK = frozenset((OpKind.F, OpKind.B, OpKind.I, OpKind.W))
