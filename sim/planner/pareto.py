"""The Pareto front of the planner's candidates: the points no other point beats on both
of two axes, one to keep low (peak memory per GPU in bytes, or GPUs) and one to keep
high (throughput in tokens/s).

A point (x, y) dominates (x', y') when x <= x', y >= y' and the two differ: it costs no
more and delivers no less. The front is the points nothing dominates; equal points do
not dominate each other, so both stay. Units: whatever the caller's axes are in.
"""
from __future__ import annotations

from collections.abc import Sequence


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """The indices of the non-dominated points (module docstring: x low, y high), in
    order of increasing x. One sweep by increasing x (decreasing y among equal x): a
    point is on the front when it beats the best y seen so far, or repeats the last
    point kept."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front: list[int] = []
    for i in order:
        if not front or points[i][1] > points[front[-1]][1] or \
                tuple(points[i]) == tuple(points[front[-1]]):
            front.append(i)
    return front
