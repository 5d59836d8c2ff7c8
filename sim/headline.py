"""The headline numbers of one run, read from its metrics JSON (Timeline.metrics: what
`--metrics-json` writes), so the report page and the JSON cannot disagree.

Units: seconds, bytes, tokens/s, TFLOP/s; fractions in 0..1. Exposed communication per
kind is the mean over ranks of the time each rank communicates with no compute running
(schedules.timeline.time_breakdown), in seconds.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clustersim.schedules.names import CP, DP, EP, PP, TP
from clustersim.schedules.timeline import EXPOSED_ORDER

KIND_NAMES = {TP: "TP", CP: "CP", EP: "EP", PP: "PP", DP: "DP", "other": "other"}
THROUGHPUT_KEYS = ("tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
                   "hardware_tflops_per_gpu", "mfu", "peak_tflops", "device", "gpus",
                   "formulas")


def headline(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Iteration time, throughput and MFU (sim.throughput's, None where unknown), bubble and
    exposed-communication fractions, exposed communication per kind (mean seconds per
    rank, kinds that are zero left out), peak memory per rank against the device's memory,
    and the ranks over it."""
    plan = (metrics.get("meta") or {}).get("plan") or {}
    breakdown = metrics["time_breakdown"]
    ranks = max(len(breakdown["per_rank"]), 1)
    peaks = {int(r): b for r, b in metrics["per_rank"]["peak_memory_bytes"].items()}
    capacity = plan.get("device_memory_bytes")
    figures = metrics.get("throughput") or {}
    return {
        "iteration_time_s": metrics["iteration_time"],
        **{key: figures.get(key) for key in THROUGHPUT_KEYS},
        "bubble_fraction": metrics["bubble_fraction"],
        "exposed_comm_fraction": metrics["exposed_comm_fraction"],
        "exposed_comm_s_per_rank": {KIND_NAMES[c]: breakdown["total"][c] / ranks
                                    for c in EXPOSED_ORDER if breakdown["total"].get(c, 0) > 0},
        "peak_memory_bytes": peaks,
        "device_memory_bytes": capacity,
        "oom_ranks": sorted(r for r, b in peaks.items() if capacity and b > capacity),
    }
