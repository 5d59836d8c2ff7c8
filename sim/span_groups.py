"""Aggregation of a large Timeline's spans for drawing: where a bar would be too thin to see,
consecutive spans of one row merge into one bar that says what it holds.

Units: seconds. A row is a (rank, lane) pair. At resolution R, a span shorter than R joins
the group before it on its row when that group's last span is also shorter than R, both
have the same time-breakdown category (schedules.timeline.span_category) and the gap
between them is shorter than R; every other span is a group of its own. A group keeps its
spans, so nothing is lost: its op time per kind sums its spans' durations (the invariant
tests/test_html_report.py checks), and its extent runs from its first start to its last end.

R is chosen per Timeline (`aggregate`): the finest of a ladder of widths, in pixels
of a chart `CHART_PX` wide, from `MAX_PX` down by factors of sqrt(2), whose groups number
at most a budget; a Timeline with at most `budget` spans is not aggregated (R = 0).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter

import numpy as np

from clustersim.schedules.timeline import Span, span_category

CHART_PX = 1500  # plot width the resolution is measured against (a 1600-px window)
MAX_PX = 8.0  # coarsest resolution tried, in pixels of CHART_PX
MIN_PX = 1 / 16  # finest resolution tried
LADDER_STEP = 2 ** 0.5


def kind_of(span: Span) -> str:
    """A span's op kind (its value): SpanGroup's default key."""
    return span.op.kind.value


@dataclass(frozen=True)
class SpanGroup:
    """Consecutive spans of one row drawn as one bar (one span: drawn as itself)."""

    spans: tuple[Span, ...]
    end: float  # the latest end of its spans (spans of one lane may overlap)

    @property
    def start(self) -> float:
        return self.spans[0].start

    @property
    def rank(self) -> int:
        return self.spans[0].rank

    @property
    def lane(self) -> str:
        return self.spans[0].lane

    @cached_property
    def busy(self) -> float:
        """Summed span durations (s): how long its ops keep the bar busy."""
        return sum(s.end - s.start for s in self.spans)

    def op_tally(self, key: Callable[[Span], str] = kind_of) -> dict[str, tuple[int, float]]:
        """Spans and their summed durations (s) per `key` (the op kind by default), in one
        pass; largest time first."""
        tally: dict[str, list] = {}
        for s in self.spans:
            entry = tally.get(k := key(s))
            if entry is None:
                entry = tally[k] = [0, 0.0]
            entry[0] += 1
            entry[1] += s.end - s.start
        return {k: (n, t) for k, (n, t) in sorted(tally.items(), key=lambda kv: -kv[1][1])}

    def op_time(self, key: Callable[[Span], str] = kind_of) -> dict[str, float]:
        """Summed span durations (s) per `key` (the op kind by default), largest first."""
        return {k: t for k, (_, t) in self.op_tally(key).items()}


class Row:
    """One (rank, lane) row: its spans by (start, end), their durations and categories,
    as lists for the general grouping and as arrays for the vectorised one."""

    def __init__(self, spans: list[Span], categories: list[str]):
        self.spans, self.categories = spans, categories
        self.start = np.array([s.start for s in spans], float)
        self.end = np.array([s.end for s in spans], float)
        self.duration = self.end - self.start  # the doubles of each span's end - start
        self.durations = self.duration.tolist()
        codes = {c: i for i, c in enumerate(dict.fromkeys(categories))}
        self.codes = np.array([codes[c] for c in categories], int)
        # each span ends no earlier than the one before it: a group's latest end is then
        # its last span's end, and whether a span joins depends on it and its predecessor
        self.monotone = bool(np.all(self.end[1:] >= self.end[:-1]))

    def bounds(self, resolution: float) -> list[tuple[int, int, float]]:
        """(first, past-the-last, latest end) of each group at `resolution`: a span joins
        the group before it when both it and that group's last span are shorter than the
        resolution, their categories agree and the gap from the group's latest end is
        shorter too (module docstring)."""
        if not self.monotone or not self.spans:
            return self._bounds_in_turn(resolution)
        short = self.duration < resolution
        joins = (short[1:] & short[:-1] & (self.codes[1:] == self.codes[:-1])
                 & (self.start[1:] - self.end[:-1] < resolution))
        firsts = np.flatnonzero(~joins) + 1
        starts = [0, *firsts.tolist()]
        pasts = [*firsts.tolist(), len(self.spans)]
        ends = self.end[np.asarray(pasts) - 1].tolist()
        return list(zip(starts, pasts, ends))

    def _bounds_in_turn(self, resolution: float) -> list[tuple[int, int, float]]:
        """`bounds` one span at a time, for rows whose spans may end before an earlier
        one (a group's latest end is then a running maximum)."""
        bounds: list[tuple[int, int, float]] = []
        first, end, last, category = 0, 0.0, 0.0, None
        for i, (s, duration, cat) in enumerate(zip(self.spans, self.durations,
                                                   self.categories)):
            if i and (duration < resolution and last < resolution and cat == category
                      and s.start - end < resolution):
                if s.end > end:
                    end = s.end
                last = duration
                continue
            if i:
                bounds.append((first, i, end))
            first, end, last, category = i, s.end, duration, cat
        if self.spans:
            bounds.append((first, len(self.spans), end))
        return bounds


def _rows(spans: Iterable[Span]) -> list[Row]:
    rows: dict[tuple[int, str], list[Span]] = defaultdict(list)
    for s in spans:
        rows[(s.rank, s.lane)].append(s)
    categories: dict[tuple, str] = {}  # (lane, kind, group) -> category, found once each

    def category_of(s: Span) -> str:
        key = (s.lane, s.op.kind, s.op.group)
        cat = categories.get(key)
        if cat is None:
            cat = categories[key] = span_category(s)
        return cat

    ordered = [sorted(row, key=attrgetter("start", "end")) for row in rows.values()]
    return [Row(row, [category_of(s) for s in row]) for row in ordered]


def _group_rows(rows: list[Row], resolution: float) -> list[SpanGroup]:
    return [SpanGroup(tuple(row.spans[first:past]), end)
            for row in rows for first, past, end in row.bounds(resolution)]


def _count_groups(rows: list[Row], resolution: float) -> int:
    """len(_group_rows(rows, resolution)) without building the groups: the bisection of
    `aggregate` asks it of several resolutions and keeps the groups of one."""
    return sum(len(row.bounds(resolution)) for row in rows)


def group_spans(spans: Iterable[Span], resolution: float) -> list[SpanGroup]:
    """The groups of `spans` at `resolution` seconds (module docstring), row by row."""
    return _group_rows(_rows(spans), resolution)


def resolution_ladder(window: float) -> list[float]:
    """Candidate resolutions (s), coarsest first: MAX_PX .. MIN_PX pixels of CHART_PX."""
    ladder, px = [], MAX_PX
    while px >= MIN_PX * 0.999:
        ladder.append(window * px / CHART_PX)
        px /= LADDER_STEP
    return ladder


def aggregate(spans: Sequence[Span], window: float, budget: int | None
              ) -> tuple[list[SpanGroup], float]:
    """The groups of `spans` at the finest ladder resolution at which they number at most
    `budget`, and that resolution (s): 0, every span its own group, when there are at most
    `budget` spans (or no budget); the coarsest rung when none fits. Bisection: a coarser
    resolution never makes more groups."""
    rows = _rows(spans)
    if budget is None or len(spans) <= budget or window <= 0:
        return _group_rows(rows, 0.0), 0.0
    ladder = resolution_ladder(window)
    fit, lo, hi = None, 0, len(ladder) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if _count_groups(rows, ladder[mid]) <= budget:
            fit, lo = mid, mid + 1
        else:
            hi = mid - 1
    chosen = ladder[0] if fit is None else ladder[fit]
    return _group_rows(rows, chosen), chosen
