"""Human-readable terminal summaries of Timelines (seconds, GB)."""
from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from clustersim.schedules.plan import header_line, model_line
from clustersim.schedules.timeline import CATEGORIES, Timeline
from clustersim.schedules.weight_stashing import summary_line

from .headline import KIND_NAMES
from .throughput import format_throughput
from .units import format_seconds


def format_summary(timeline: Timeline) -> str:
    """The run's header (its plan: schedules.plan.header_line, and the cost model), the
    iteration time and bubble, per-rank compute, idle, in-flight and peak memory, the time
    breakdown, warnings and the OOM report (the time breakdown swept once:
    Timeline.metrics)."""
    meta, metrics = timeline.meta, timeline.metrics()
    head = header_line(meta["plan"]) if "plan" in meta else f"{timeline.source} timeline"
    lines = [f"{head} costs={meta.get('cost_model', 'unknown')}",
             *([model_line(meta["plan"])] if "plan" in meta else []),
             *([meta["replayed"]] if "replayed" in meta else []),
             *([summary_line(meta["steady_state"])] if "steady_state" in meta else []),
             f"iteration time {format_seconds(timeline.iteration_time)}, "
             f"bubble fraction {metrics['bubble_fraction']:.4f} (no op running), exposed "
             f"communication {metrics['exposed_comm_fraction']:.4f} (communication, no "
             f"compute)",
             *([format_throughput(meta["throughput"])] if "throughput" in meta else [])]
    per_rank = metrics["per_rank"]
    memory = timeline.peak_memory()
    lines.append(_table(["rank", "compute", "idle", "bubble", "in-flight (s,mb)", "peak mem"], [
        [r, format_seconds(per_rank["compute_time"][str(r)]),
         format_seconds(per_rank["idle_time"][str(r)]),
         f"{per_rank['bubble_fraction'][str(r)]:.4f}",
         per_rank["peak_in_flight_microbatches"].get(str(r), 0),
         f"{memory[r] / 1e9:.1f} GB" if r in memory else "n/a"] for r in timeline.ranks]))
    if len(memory) < len(timeline.ranks):
        lines.append("peak mem n/a: this timeline has no memory samples for those ranks "
                     "(not measured), which is not zero memory")
    lines += format_breakdown(metrics["time_breakdown"]["per_rank"])
    lines += [f"warning: {w}" for w in meta.get("warnings", ())]
    lines += [format_oom(entry) for entry in meta.get("oom", ())]
    return "\n".join(lines)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A right-aligned plain table (tabulate)."""
    return tabulate(rows, headers=headers, tablefmt="plain", disable_numparse=True,
                    colalign=["right"] * len(headers))


def format_breakdown(breakdown: dict[str, dict[str, float]]) -> list[str]:
    """Per rank (`breakdown`: rank -> category -> seconds, Timeline.metrics'
    time_breakdown) and on average: compute, exposed communication by group, bubble
    (schedules.timeline.time_breakdown). Categories that are zero everywhere are left
    out."""
    if not breakdown:
        return []
    total = {c: sum(row[c] for row in breakdown.values()) for c in CATEGORIES}
    shown = [c for c in CATEGORIES if total[c] > 0 or c in ("compute", "bubble")]
    rows = [[rank, *(format_seconds(row[c]) for c in shown)]
            for rank, row in sorted(breakdown.items(), key=lambda item: int(item[0]))]
    rows.append(["mean", *(format_seconds(total[c] / len(breakdown)) for c in shown)])
    return ["time breakdown: compute, exposed communication (not overlapped by compute), "
            "bubble (no op running)",
            _table(["rank", *(KIND_NAMES.get(c, c) for c in shown)], rows)]


def format_oom(entry: dict) -> str:
    """One OOM line of sim.memory.oom_report: rank, time, and the breakdown in GB."""
    parts = ", ".join(f"{label} {entry[key] / 1e9:.1f}" for label, key in (
        ("parameters", "parameters_bytes"), ("gradients", "gradients_bytes"),
        ("optimizer", "optimizer_states_bytes"), ("hpZ", "hpz_secondary_bytes"),
        ("stashed weights", "stashed_weights_bytes"),
        ("buffers", "communication_buffers_bytes"),
        ("recompute working set", "recompute_working_bytes"),
        ("gathered parameters", "gathered_parameters_bytes"),
        ("unsharded gradients", "unsharded_gradients_bytes"),
        ("activations", "activations_bytes"))
        if entry.get(key))
    return (f"OOM: rank {entry['rank']} peaks at {entry['peak_bytes'] / 1e9:.1f} GB at "
            f"{format_seconds(entry['time_s'])}, over the device's "
            f"{entry['capacity_bytes'] / 1e9:.1f} GB by {entry['over_bytes'] / 1e9:.1f} GB "
            f"({parts} GB)")


def format_table(rows: Sequence[dict]) -> str:
    """The `compare` table: one row per schedule (throughput: sim.throughput's formulas)."""
    return tabulate(
        [[row["schedule"], format_seconds(row["iteration_time_s"]),
          f"{row['bubble_fraction']:.4f}", f"{row['tokens_per_s_per_gpu']:,.0f}",
          "n/a" if row["mfu"] is None else f"{row['mfu']:.1%}",
          f"{row['peak_memory_GB']:.1f} GB", row["peak_in_flight"]] for row in rows],
        headers=["schedule", "iteration", "bubble", "tokens/s/GPU", "MFU", "peak mem",
                 "in-flight (s,mb) per rank"], tablefmt="plain", disable_numparse=True,
        colalign=["left", *["right"] * 5, "left"])
