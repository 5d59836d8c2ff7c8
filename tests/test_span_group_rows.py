"""sim.span_groups.Row: the vectorised grouping of a row whose spans end in order gives
the groups of the one-span-at-a-time rule (the module docstring's), on random rows."""
from __future__ import annotations

import random

import pytest

from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.timeline import Span
from clustersim.sim.span_groups import Row


def random_row(rng: random.Random) -> Row:
    t, spans = 0.0, []
    for i in range(rng.randint(1, 60)):
        t += rng.choice([0.0, rng.random() * 0.01, rng.random()])
        spans.append(Span(0, "compute", Op(OpKind.F, 0, i), t,
                          t + rng.choice([0.0, rng.random() * 0.01, rng.random() * 0.3])))
    spans.sort(key=lambda s: (s.start, s.end))
    return Row(spans, [rng.choice(["compute", "tp"]) for _ in spans])


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_bounds_equal_the_rule_span_by_span(seed):
    rng = random.Random(seed)
    for _ in range(20):
        row = random_row(rng)
        for resolution in (0.0, 0.001, 0.005, 0.05, 0.2, 1.0):
            assert row.bounds(resolution) == row._bounds_in_turn(resolution)


def test_a_row_whose_spans_end_out_of_order_takes_the_running_maximum():
    """The last span joins: its gap counts from the group's latest end (the first span's,
    0.5 s), not from the span before it (0.02 s), which the vectorised rule would use."""
    long, inner, after = (Span(0, "dp", Op(OpKind.ALL_REDUCE, 0), 0.0, 0.5),
                          Span(0, "dp", Op(OpKind.ALL_REDUCE, 1), 0.01, 0.02),
                          Span(0, "dp", Op(OpKind.ALL_REDUCE, 2), 0.7, 0.71))
    row = Row([long, inner, after], ["dp"] * 3)
    assert not row.monotone
    assert row.bounds(0.6) == [(0, 3, 0.71)]
    assert row.bounds(0.4) == [(0, 1, 0.5), (1, 2, 0.02), (2, 3, 0.71)]
