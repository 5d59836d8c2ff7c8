"""The run's report: one standalone HTML page (plotly.js inlined, works offline).

From the top: the title; an out-of-memory banner when any rank's peak memory exceeds the
device's; the resolved plan; the headline numbers and a table per rank (their numbers are
sim.headline's view of the metrics JSON, Timeline.metrics); then the Gantt chart, each row
named by its GPUs, with the memory panel and the device's memory drawn as a line under it
(sim.gantt). Each figure has a caption saying what it shows and its units, and whether
spans were merged for drawing (sim.span_groups) and where every op is: the Perfetto trace.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

from clustersim.schedules.output_files import write_text_atomic
from clustersim.schedules.timeline import Timeline

from .gantt import AGGREGATE_BUDGET, PLOT_CONFIG, describe, gantt_figure
from .headline import headline
from .rank_gpus import RankGpus, rank_gpus
from .report_sections import gb, headline_section, oom_banner, plan_section, rank_section
from .span_groups import CHART_PX
from .units import format_seconds

PERFETTO = "https://ui.perfetto.dev"
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 12px; } h2 { font-size: 16px; margin: 20px 0 6px; }
table { border-collapse: collapse; margin: 4px 0 8px; }
td, th { border: 1px solid #DDD; padding: 3px 8px; text-align: left; vertical-align: top; }
thead th { background: #F3F4F7; } tbody th { background: #FAFAFB; font-weight: 600; }
tr.oom td { background: #FDE7EA; }
#oom-banner { background: #FDE7EA; border: 2px solid #B00020; color: #6B0013; padding: 8px 12px;
       margin: 0 0 12px; border-radius: 4px; }
figure { margin: 0; } figcaption p { max-width: 1100px; margin: 4px 0; }
"""


def _spans_caption(drawn: dict, trace_path: str | Path | None,
                   example: RankGpus | None) -> str:
    """What the Gantt shows, its units, and whether and how spans were merged."""
    text = ("<b>Spans.</b> One row per rank and lane (compute; send and recv: pipeline "
            "transfers; tp, dp, ...: collectives on that group), rank 0 on top; colour: op "
            "kind (legend); x: seconds since the iteration's first span. ")
    if example and len(example.stands_for) > 1:
        more = len(example.stands_for) - 1
        text += (f"A row name such as <code>{escape(example.label)} · compute</code> is "
                 f"pipeline rank {example.rank}, replayed op by op on GPU {example.gpu}; under "
                 f"the symmetric replay it also stands for {more} more GPUs of the same "
                 f"pipeline coordinate, which run the same program and are assumed to take "
                 f"the same time (the hover names them). ")
    elif example:
        text += (f"A row name such as <code>{escape(example.label)} · compute</code> is "
                 f"pipeline rank {example.rank}, replayed op by op on GPU {example.gpu}. ")
    text += "Hover a bar for its op, stage, microbatch, times and bytes."
    where = (f"the Perfetto trace <code>{escape(str(trace_path))}</code> (open it at "
             f"{PERFETTO})" if trace_path else
             f"a Perfetto trace: run again with <code>--trace-json PATH</code> and open it "
             f"at {PERFETTO}")
    if not drawn["resolution_s"]:
        return text + f" Every span is drawn; the same spans are in {where}."
    r = drawn["resolution_s"]
    px = r * CHART_PX / max(drawn["extent_s"], 1e-30)
    return text + (
        f" <b>Aggregated:</b> {drawn['spans']:,} spans are drawn as {drawn['bars']:,} bars. "
        f"On each row, consecutive spans of one category shorter than {format_seconds(r)} "
        f"(about {px:.1f} px of a {CHART_PX}-px-wide chart) and less than that apart are "
        f"merged into one hatched bar, as opaque as its ops keep it busy; its hover lists "
        f"the ops it holds and their summed time. Zooming in does not split such a bar. "
        f"Every op, with its own times, is in {where}.")


def _memory_caption(timeline: Timeline) -> str:
    if not timeline.memory:
        return ("<b>Memory.</b> This Timeline has no memory samples (not measured), which "
                "is not zero memory.")
    plan = timeline.meta.get("plan") or {}
    limit = (f" The dashed red line is the device's memory ({gb(plan['device_memory_bytes'])}"
             f", {escape(str(plan.get('device')))}): a curve above it does not fit."
             if plan.get("device_memory_bytes") else
             " The device's memory is unknown (no cluster in the plan), so no limit is drawn.")
    return ("<b>Memory</b> (the panel under the spans, same time axis): bytes held on each "
            "rank's GPU, in GB (1e9 bytes), stepping at each op that allocates or frees."
            + limit)


def report_html(timeline: Timeline, trace_path: str | Path | None = None,
                budget: int | None = AGGREGATE_BUDGET) -> str:
    """The report page as HTML text (module docstring); `trace_path`: where the run's
    Perfetto trace is, named on the page; `budget`: gantt_figure's."""
    metrics = timeline.metrics()
    numbers = headline(metrics)
    gpus = rank_gpus(timeline.meta.get("plan"))
    title = describe(timeline)
    fig = gantt_figure(timeline, title, budget)
    drawn = fig.layout.meta["drawn"][0]
    title = escape(title)
    chart = fig.to_html(full_html=False, include_plotlyjs=True, config=PLOT_CONFIG,
                        div_id="gantt")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}"
            f"</title><style>{STYLE}</style></head><body>"
            f"<h1>{title}</h1>{oom_banner(numbers, timeline, gpus)}"
            f"<h2>Plan</h2>{plan_section(timeline)}"
            f"<h2>Headline numbers</h2>{headline_section(numbers)}"
            f"<h2>Per rank</h2>{rank_section(timeline.ranks, metrics, numbers, gpus)}"
            f"<h2>Timeline</h2><figure><figcaption><p>"
            f"{_spans_caption(drawn, trace_path, next(iter(gpus.values()), None))}</p>"
            f"<p>{_memory_caption(timeline)}</p></figcaption>{chart}</figure></body></html>")


def write_report(timeline: Timeline, path: str | Path, trace_path: str | Path | None = None,
                 budget: int | None = AGGREGATE_BUDGET) -> Path:
    """Write the report page (atomically: schedules.output_files); returns its path."""
    return write_text_atomic(path, report_html(timeline, trace_path, budget))
