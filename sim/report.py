"""Human-readable terminal summaries of Timelines (seconds, GB)."""
from __future__ import annotations

from collections.abc import Sequence

from clustersim.schedules.plan import header_line, model_line
from clustersim.schedules.timeline import CATEGORIES, Timeline
from clustersim.schedules.weight_stashing import summary_line

from .headline import KIND_NAMES
from .throughput import format_throughput
from .units import format_seconds


def format_summary(timeline: Timeline) -> str:
    """The run's header (its plan: schedules.plan.header_line, and the cost model), the
    iteration time and bubble, per-rank compute, idle, in-flight and peak memory, the time
    breakdown, warnings and the OOM report."""
    meta = timeline.meta
    head = header_line(meta["plan"]) if "plan" in meta else f"{timeline.source} timeline"
    lines = [f"{head} costs={meta.get('cost_model', 'unknown')}",
             *([model_line(meta["plan"])] if "plan" in meta else []),
             *([meta["replayed"]] if "replayed" in meta else []),
             *([summary_line(meta["steady_state"])] if "steady_state" in meta else []),
             f"iteration time {format_seconds(timeline.iteration_time)}, "
             f"bubble fraction {timeline.bubble_fraction:.4f} (nothing in flight), exposed "
             f"communication {timeline.exposed_comm_fraction:.4f} (communication, no compute)",
             *([format_throughput(meta["throughput"])] if "throughput" in meta else []),
             f"{'rank':>4} {'compute':>12} {'idle':>12} {'bubble':>7} {'in-flight':>9} "
             f"{'peak mem':>9}"]
    busy, idle = timeline.compute_busy(), timeline.idle_time()
    bubble, flight = timeline.bubble_fractions(), timeline.peak_in_flight()
    memory = timeline.peak_memory()
    for r in timeline.ranks:
        peak = f"{memory[r] / 1e9:>6.1f} GB" if r in memory else f"{'n/a':>9}"
        lines.append(f"{r:>4} {format_seconds(busy[r]):>12} {format_seconds(idle[r]):>12} "
                     f"{bubble[r]:>7.4f} {flight.get(r, 0):>9} {peak}")
    if len(memory) < len(timeline.ranks):
        lines.append("peak mem n/a: this timeline has no memory samples for those ranks "
                     "(not measured), which is not zero memory")
    lines += format_breakdown(timeline)
    lines += [f"warning: {w}" for w in meta.get("warnings", ())]
    lines += [format_oom(entry) for entry in meta.get("oom", ())]
    return "\n".join(lines)


def format_breakdown(timeline: Timeline) -> list[str]:
    """Per rank and in total: compute, exposed communication by group, bubble (seconds;
    schedules.timeline.time_breakdown). Categories that are zero everywhere are left out."""
    breakdown = timeline.time_breakdown()
    if not breakdown:
        return []
    total = {c: sum(row[c] for row in breakdown.values()) for c in CATEGORIES}
    shown = [c for c in CATEGORIES if total[c] > 0 or c in ("compute", "bubble")]
    lines = ["time breakdown: compute, exposed communication (not overlapped by compute), "
             "bubble (nothing in flight)",
             f"{'rank':>4} " + " ".join(f"{KIND_NAMES.get(c, c):>10}" for c in shown)]
    for rank, row in sorted(breakdown.items()):
        lines.append(f"{rank:>4} " + " ".join(f"{format_seconds(row[c]):>10}" for c in shown))
    ranks = len(breakdown)
    lines.append(f"{'mean':>4} " + " ".join(f"{format_seconds(total[c] / ranks):>10}"
                                             for c in shown))
    return lines


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
            f"{entry['capacity_bytes'] / 1e9:.0f} GB by {entry['over_bytes'] / 1e9:.1f} GB "
            f"({parts} GB)")


def format_table(rows: Sequence[dict]) -> str:
    """The `compare` table: one row per schedule (throughput: sim.throughput's formulas)."""
    width = max([28, *(len(row["schedule"]) for row in rows)])
    lines = [f"{'schedule':{width}} {'iteration':>12} {'bubble':>7} {'tokens/s/GPU':>12} "
             f"{'MFU':>6} {'peak mem':>9}  in-flight per rank"]
    for row in rows:
        mfu = f"{row['mfu']:>6.1%}" if row["mfu"] is not None else f"{'n/a':>6}"
        lines.append(f"{row['schedule']:{width}} {format_seconds(row['iteration_time_s']):>12} "
                     f"{row['bubble_fraction']:>7.4f} {row['tokens_per_s_per_gpu']:>12,.0f} "
                     f"{mfu} {row['peak_memory_GB']:>6.1f} GB  {row['peak_in_flight']}")
    return "\n".join(lines)
