"""Two Timelines side by side (e.g. simulated against measured): the iteration-time error
and the mean span duration per op kind and per (op kind, stage) of A against B, the
reference: error = (A - B) / B in percent. Times in seconds."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from clustersim.schedules.ops import OpKind
from clustersim.schedules.timeline import Timeline

from .units import format_seconds


def _error(a: float, b: float) -> float | None:
    return (a - b) / b * 100 if b else None


KIND_ORDER = tuple(kind.value for kind in OpKind)  # the rows in op-kind order


def _mean_durations(t: Timeline, per_stage: bool) -> dict[tuple, list[float]]:
    groups: dict[tuple, list[float]] = defaultdict(list)
    for s in t.spans:
        key = (s.op.kind.value, s.op.stage) if per_stage else (s.op.kind.value,)
        groups[key].append(s.duration)
    return groups


def _rows(a: Timeline, b: Timeline, per_stage: bool) -> list[dict[str, Any]]:
    ga, gb = _mean_durations(a, per_stage), _mean_durations(b, per_stage)
    keys = sorted(set(ga) | set(gb), key=lambda k: (
        KIND_ORDER.index(k[0]) if k[0] in KIND_ORDER else len(KIND_ORDER), *k[1:]))
    rows = []
    for key in keys:
        mean_a = sum(ga[key]) / len(ga[key]) if ga.get(key) else None
        mean_b = sum(gb[key]) / len(gb[key]) if gb.get(key) else None
        row = {"kind": key[0], **({"stage": key[1]} if per_stage else {}),
               "count_a": len(ga.get(key, ())), "count_b": len(gb.get(key, ())),
               "mean_a_s": mean_a, "mean_b_s": mean_b,
               "error_pct": _error(mean_a, mean_b) if None not in (mean_a, mean_b) else None}
        rows.append(row)
    return rows


def compare_timelines(a: Timeline, b: Timeline) -> dict[str, Any]:
    """Iteration time, and mean span durations per op kind and per (op kind, stage), of A
    against B (the reference): error = (A - B) / B in percent."""
    return {"a": {"source": a.source, "iteration_time_s": a.iteration_time,
                  "bubble_fraction": a.bubble_fraction, "steady_state": a.window is not None},
            "b": {"source": b.source, "iteration_time_s": b.iteration_time,
                  "bubble_fraction": b.bubble_fraction, "steady_state": b.window is not None},
            "iteration_time_error_pct": _error(a.iteration_time, b.iteration_time),
            "op_kinds": _rows(a, b, per_stage=False),
            "op_kinds_per_stage": _rows(a, b, per_stage=True)}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}%"


def format_comparison(result: dict[str, Any], label_a: str, label_b: str) -> str:
    a, b = result["a"], result["b"]
    lines = [f"A: {label_a} ({a['source']})", f"B: {label_b} ({b['source']}) — the reference",
             f"iteration time  A {format_seconds(a['iteration_time_s'])}  "
             f"B {format_seconds(b['iteration_time_s'])}  "
             f"error (A-B)/B {_pct(result['iteration_time_error_pct'])}",
             f"bubble fraction A {a['bubble_fraction']:.4f}  B {b['bubble_fraction']:.4f}",
             f"{'op kind':10} {'count A':>7} {'count B':>7} {'mean A':>12} {'mean B':>12} "
             f"{'error':>9}"]
    windowed = [label for label, t in (("A", a), ("B", b)) if t.get("steady_state")]
    if windowed:  # PipeDream / 2BW: schedules.weight_stashing
        lines.insert(2, f"note: {' and '.join(windowed)} {'is' if len(windowed) == 1 else 'are'}"
                        f" the steady-state batch of an asynchronous schedule (no flush, stale "
                        f"weights), not one flushed iteration; the op counts and means below "
                        f"cover its whole run")
    per_stage = result["op_kinds_per_stage"]
    several = len({r["stage"] for r in per_stage}) > 1
    for row in result["op_kinds"] + (per_stage if several else []):
        mean = [format_seconds(v) if v is not None else "-" for v in (row["mean_a_s"],
                                                                     row["mean_b_s"])]
        label = row["kind"] + (f" s{row['stage']}" if "stage" in row else "")
        lines.append(f"{label:10} {row['count_a']:>7} {row['count_b']:>7} "
                     f"{mean[0]:>12} {mean[1]:>12} {_pct(row['error_pct']):>9}")
    return "\n".join(lines)
