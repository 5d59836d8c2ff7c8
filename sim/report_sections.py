"""The text sections of the HTML report (sim.html_report): the out-of-memory banner, the
resolved plan, the headline numbers and the per-rank table, as HTML fragments.

Every number carries its unit: seconds as s/ms/µs (sim.units), memory in GB (1e9 bytes),
throughput in tokens/s and TFLOP/s, fractions as percentages. The words are the terminal
summary's (sim.report, schedules.plan.header_line / model_line), so both read alike.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from itertools import repeat
from typing import Any

from clustersim.schedules.plan import header_line, model_line
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.weight_stashing import summary_line

from .headline import KIND_NAMES
from .rank_gpus import RankGpus
from .report import format_oom
from .units import format_seconds


def table(rows: Iterable[Sequence[str]], head: Sequence[str] | None = None,
          classes: Sequence[str] | None = None, table_id: str = "",
          row_heads: bool = False) -> str:
    """An HTML table of already-escaped cells; `classes` per row (e.g. 'oom'); with
    `row_heads`, each row's first cell is its header."""
    def cells(row: Sequence[str]) -> str:
        return "".join(f"<th>{cell}</th>" if row_heads and i == 0 else f"<td>{cell}</td>"
                       for i, cell in enumerate(row))

    body = "".join(f"<tr{f' class={c!r}' if c else ''}>{cells(row)}</tr>"
                   for row, c in zip(rows, classes or repeat("")))
    thead = ("<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head)
             + "</tr></thead>") if head else ""
    return f"<table{f' id={table_id!r}' if table_id else ''}>{thead}<tbody>{body}</tbody></table>"


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def _gpu_cell(rank: int, gpus: Mapping[int, RankGpus]) -> str:
    return escape(gpus[rank].describe()) if rank in gpus else "n/a (no cluster in the plan)"


def oom_banner(numbers: Mapping[str, Any], timeline: Timeline,
               gpus: Mapping[int, RankGpus]) -> str:
    """The out-of-memory banner ('' when every rank fits): which ranks and GPUs peak over
    the device's memory, by how much, and the memory model's breakdown of each peak."""
    over = numbers["oom_ranks"]
    if not over:
        return ""
    capacity = numbers["device_memory_bytes"]
    peaks = numbers["peak_memory_bytes"]
    device = (timeline.meta.get("plan") or {}).get("device") or "the device"
    items = [f"<li>rank {r} ({_gpu_cell(r, gpus)}): peak {gb(peaks[r])}, "
             f"{gb(peaks[r] - capacity)} over</li>" for r in over]
    details = "".join(f"<li>{escape(format_oom(entry))}</li>"
                      for entry in timeline.meta.get("oom", ()))
    return (f'<div id="oom-banner" class="oom" role="alert"><strong>Out of memory:</strong> '
            f"{len(over)} of {len(peaks)} ranks peak above the {gb(capacity)} of one "
            f"{escape(device)}. This run does not fit; its times assume it did."
            f"<ul>{''.join(items)}</ul>"
            + (f"<p>Memory model at each peak (GB):</p><ul>{details}</ul>" if details else "")
            + "</div>")


def plan_section(timeline: Timeline) -> str:
    """The resolved plan: layout, model, schedule, cluster, what was replayed, cost model;
    the plan's plain fields as they are when it is partial (an older or hand-made one)."""
    meta = timeline.meta
    plan = meta.get("plan")
    if not plan:
        return (f"<p>No plan recorded: a {escape(timeline.source)} Timeline without "
                f"meta['plan'].</p>")
    try:
        rows = _plan_rows(plan)
    except (KeyError, TypeError):
        rows = [(escape(str(k)), escape(str(v))) for k, v in plan.items()
                if isinstance(v, (str, int, float))]
    rows += [(label, escape(str(meta[key]))) for label, key in (
        ("replayed", "replayed"), ("cost model", "cost_model")) if key in meta]
    if "steady_state" in meta:
        rows.append(("asynchronous", escape(summary_line(meta["steady_state"]))))
    rows += [("warning", escape(w)) for w in meta.get("warnings", ())]
    rows += [("limit", escape(w)) for w in meta.get("limits", ())]
    return table(rows, table_id="plan", row_heads=True)


def _plan_rows(plan: Mapping[str, Any]) -> list[tuple[str, str]]:
    cluster = (f"{escape(plan['topology'])}: {plan['world_size']} GPUs of "
               f"{escape(str(plan['device']))}, {gb(plan['device_memory_bytes'])} each"
               if plan.get("topology") and plan.get("device_memory_bytes") else
               f"this host: {plan['world_size']} ranks (no cluster in the plan)")
    return [("layout", escape(header_line(plan))),
            ("model", escape(model_line(plan))),
            ("schedule", f"{escape(plan['schedule'])} ({escape(plan['placement'])} "
                         f"placement): {plan['pp']} pipeline ranks × {plan['vpp']} virtual "
                         f"stages, {plan['microbatches']} microbatches of "
                         f"{plan['micro_batch_size']} sequences, global batch "
                         f"{plan['global_batch_size']} sequences"),
            ("cluster", cluster)]


def headline_section(numbers: Mapping[str, Any]) -> str:
    """The headline numbers, each with its unit and what it counts."""
    t = numbers["iteration_time_s"]
    rows = [("iteration time", format_seconds(t), "one training iteration, simulated")]
    if numbers["tokens_per_s"] is not None:
        rows += [("throughput", f"{numbers['tokens_per_s']:,.0f} tokens/s",
                  f"{numbers['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
                  f"{numbers['gpus']} GPUs"),
                 ("model FLOP/s", f"{numbers['model_tflops_per_gpu']:.1f} TFLOP/s per GPU",
                  numbers["formulas"]["model_tflops_per_gpu"]),
                 ("MFU", f"{numbers['mfu']:.1%}" if numbers["mfu"] is not None else "n/a",
                  f"of {numbers['peak_tflops']:.0f} TFLOP/s dense peak "
                  f"({escape(numbers['device'])})" if numbers["mfu"] is not None
                  else "no dense peak for this device and dtype")]
    rows += [("bubble", f"{numbers['bubble_fraction']:.1%}",
              "mean over ranks of the iteration with no op running"),
             ("exposed communication", f"{numbers['exposed_comm_fraction']:.1%}",
              "mean over ranks of the iteration communicating with no compute")]
    rows += [(f"exposed {kind}", format_seconds(s), f"per rank (mean), {s / t:.1%} of the "
              "iteration" if t > 0 else "per rank (mean)")
             for kind, s in numbers["exposed_comm_s_per_rank"].items()]
    peaks, capacity = numbers["peak_memory_bytes"], numbers["device_memory_bytes"]
    if peaks:
        top = max(peaks, key=peaks.get)
        rows.append(("peak memory", gb(peaks[top]), f"rank {top}, the highest"
                     + (f"; {peaks[top] / capacity:.0%} of the device's {gb(capacity)}"
                        if capacity else "")))
    return table([[escape(cell) for cell in row] for row in rows],
                 head=("quantity", "value", "unit and meaning"), table_id="headline",
                 row_heads=True)


def rank_section(ranks: Sequence[int], metrics: Mapping[str, Any],
                 numbers: Mapping[str, Any], gpus: Mapping[int, RankGpus]) -> str:
    """Per rank: its GPUs, compute, exposed communication per kind, bubble (the metrics
    JSON's time breakdown), and peak memory against the device's (rows over it marked)."""
    breakdown = {int(r): row for r, row in metrics["time_breakdown"]["per_rank"].items()}
    kinds = [c for c in KIND_NAMES if any(row.get(c, 0) > 0 for row in breakdown.values())]
    peaks, capacity = numbers["peak_memory_bytes"], numbers["device_memory_bytes"]
    rows, classes = [], []
    for rank in ranks:
        row = breakdown.get(rank, {})
        peak = (gb(peaks[rank]) + (f" ({peaks[rank] / capacity:.0%})" if capacity else "")
                if rank in peaks else "n/a")
        rows.append([str(rank), _gpu_cell(rank, gpus),
                     format_seconds(row.get("compute", 0.0)),
                     *(format_seconds(row.get(c, 0.0)) for c in kinds),
                     format_seconds(row.get("bubble", 0.0)), escape(peak)])
        classes.append("oom" if rank in numbers["oom_ranks"] else "")
    head = ("rank", "GPUs", "compute", *(f"exposed {KIND_NAMES[c]}" for c in kinds),
            "bubble", "peak memory" + (f" (% of {gb(capacity)})" if capacity else ""))
    return table(rows, head, classes, table_id="ranks")
