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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clustersim.schedules.timeline import Span, span_category

CHART_PX = 1500  # plot width the resolution is measured against (a 1600-px window)
MAX_PX = 8.0  # coarsest resolution tried, in pixels of CHART_PX
MIN_PX = 1 / 16  # finest resolution tried
LADDER_STEP = 2 ** 0.5


@dataclass(frozen=True, slots=True)
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

    def op_time(self, key=lambda s: s.op.kind.value) -> dict[str, float]:
        """Summed span durations (s) per `key` (the op kind by default), largest first."""
        total: dict[str, float] = defaultdict(float)
        for s in self.spans:
            total[key(s)] += s.duration
        return dict(sorted(total.items(), key=lambda kv: -kv[1]))

    def op_counts(self, key=lambda s: s.op.kind.value) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for s in self.spans:
            counts[key(s)] += 1
        return dict(counts)


Row = list[tuple[Span, float, str]]  # a row's spans in start order, durations, categories


def _rows(spans: Iterable[Span]) -> list[Row]:
    rows: dict[tuple[int, str], list[Span]] = defaultdict(list)
    for s in spans:
        rows[(s.rank, s.lane)].append(s)
    return [[(s, s.duration, span_category(s)) for s in sorted(row, key=lambda s: (s.start,
                                                                                   s.end))]
            for row in rows.values()]


def _group_rows(rows: list[Row], resolution: float) -> list[SpanGroup]:
    groups: list[SpanGroup] = []
    for row in rows:
        members: list[Span] = []
        end, last, category = 0.0, 0.0, None
        for s, duration, cat in row:
            if (members and duration < resolution and last < resolution and cat == category
                    and s.start - end < resolution):
                members.append(s)
                end, last = max(end, s.end), duration
                continue
            if members:
                groups.append(SpanGroup(tuple(members), end))
            members, end, last, category = [s], s.end, duration, cat
        if members:
            groups.append(SpanGroup(tuple(members), end))
    return groups


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
        groups = _group_rows(rows, ladder[mid])
        if len(groups) <= budget:
            fit, lo = (mid, groups), mid + 1
        else:
            hi = mid - 1
    if fit is None:
        return _group_rows(rows, ladder[0]), ladder[0]
    return fit[1], ladder[fit[0]]
