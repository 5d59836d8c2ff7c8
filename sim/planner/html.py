"""The planner's report page (`clustersim plan --html PATH`): one standalone HTML file
(plotly.js inlined once, works offline).

From the top: the title (model, GPUs, topology, batch); the Pareto front of throughput
against peak memory per GPU (sim.planner.figures; and against GPUs when searches at
several GPU counts are given); the search funnel as a chart and as the `--json` funnel's
numbers, with each rejection reason counted; the ranked candidates, the front's rows
marked; the Gantt charts of the winner above the runner-up on one time axis (sim.gantt's
comparison figure). The search keeps only each replay's figures, so the two are replayed
again with the search's simulator (sim.simulate with the cost model given): the same
layouts and the same deterministic replay, so their iteration times are the table's (the
page says so if they differ). Units: seconds as s/ms/µs (sim.units), throughput in
tokens/s, memory in GB (1e9 bytes), MFU in % of the device's dense peak.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path

import networkx as nx
import plotly.graph_objects as go

from clustersim.schedules.output_files import write_text_atomic
from clustersim.schedules.timeline import Timeline

from ..cost_model import CostModel, RooflineCostModel
from ..gantt import PLOT_CONFIG, comparison_figure
from ..html_report import STYLE
from ..report_sections import table
from ..simulate import simulate
from ..units import format_seconds
from .figures import GB, funnel_counts, funnel_figure, gpus_front_figure, memory_front_figure
from .pareto import pareto_front
from .report import funnel, why
from .search import Candidate, SearchResult, Simulator
from .space import ZERO_NAMES

log = logging.getLogger(__name__)

PAGE_STYLE = STYLE + "tr.front td { background: #FDECEC; } td code { font-size: 12px; }\n"
LEADER_NAMES = ("#1 winner", "#2 runner-up")


def replay_leaders(result: SearchResult, topology: nx.DiGraph,
                   costs: CostModel | None = None, simulator: Simulator | None = None
                   ) -> list[tuple[Candidate, Timeline]]:
    """The winner and runner-up (the first two ranked candidates) with the Timelines of
    replaying them again: `simulator(model, parallel, topology)` as the search takes it
    (default sim.simulate with `costs`, the search's default)."""
    model_costs = costs or RooflineCostModel()
    replay = simulator or (lambda model, parallel, graph: simulate(model, parallel, graph,
                                                                   costs=model_costs))
    return [(c, replay(c.plan.model, c.plan.parallel, topology))
            for c in result.candidates[:2]]


def _title(result: SearchResult, topology: nx.DiGraph) -> str:
    if not result.candidates:
        return "clustersim plan: no layout fits and runs"
    plan = result.candidates[0].plan
    return (f"clustersim plan: {plan.model.name or 'model'} on {plan.world_size} GPUs of "
            f"{topology.graph.get('name', 'the topology')}, global batch "
            f"{plan.parallel.global_batch_size} × {plan.model.seq_length} tokens")


def _chart(fig, div_id: str, first: bool) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=first, config=PLOT_CONFIG,
                       div_id=div_id)


def _front_caption(result: SearchResult, bounded: int) -> str:
    text = (f"<p><b>Pareto front.</b> Each dot is a layout the search simulated event by "
            f"event: x its busiest rank's peak memory per GPU (GB = 1e9 bytes), y the job's "
            f"throughput (tokens/s = global batch × seq length / iteration). Red: the front, "
            f"the layouts no other simulated one beats on both (at least as many tokens/s "
            f"with no more memory); grey: dominated. The dashed line is the memory limit of "
            f"the search ({result.capacity_bytes / GB:.1f} GB per GPU). Hover a dot for its "
            f"layout. The search simulates only the layouts whose lower bound could still "
            f"enter its top, so this is the front of what was simulated, not of all "
            f"{result.fit_in_memory:,} layouts that fit.</p>")
    if bounded:
        text += (f"<p>The {bounded:,} open triangles are layouts bounded out, never "
                 f"simulated: their y is an <b>upper bound</b> on throughput (from a lower "
                 f"bound on the iteration), their x the memory model's peak. Bounds, not "
                 f"results.</p>")
    return text


def _funnel_section(result: SearchResult) -> str:
    counts = funnel(result)
    rows = [[escape(label), f"<code>{key}</code>", f"{n:,}"]
            for key, label, n in funnel_counts(counts)]
    rows += [[escape(label), f"<code>{key}</code>", f"{counts[key]:,}"] for key, label in (
        ("path_bounds", "bounds refined by the compute-only critical path"),
        ("lowered_bounds", "bounds refined by the lowered schedule's contract walk"))]
    rows.append(["search time", "<code>seconds.total</code>",
                 format_seconds(counts["seconds"].get("total", 0.0))])
    reasons = [[f"{n:,}", escape(text)] for text, n in counts["rejected"].items()]
    return (table(rows, head=("stage", "JSON field", "layouts"), table_id="funnel-counts")
            + (table(reasons, head=("rejected", "reason (numbers masked as N)"),
                     table_id="rejected") if reasons else "<p>No layout was rejected.</p>"))


def _candidates_section(result: SearchResult, commands: Sequence[str], on_front: set[int],
                        top: int | None) -> str:
    best = result.candidates[0]
    rows = [[str(i + 1), escape(c.layout.describe()), escape(ZERO_NAMES[c.layout.zero]),
             format_seconds(c.result["iteration_time"]), f"{c.result['tokens_per_s']:,.0f}",
             "n/a" if c.result["mfu"] is None else f"{c.result['mfu']:.1%}",
             f"{c.result['peak_memory'] / GB:.1f} GB", format_seconds(c.bound),
             "yes" if i in on_front else "", escape(why(c, best)), f"<code>{escape(cmd)}</code>"]
            for i, (c, cmd) in enumerate(zip(result.candidates, commands))]
    exact = (f"The first {min(top, len(rows))} are the best of the whole space (exact); "
             f"the rest were simulated on the way and are ranked among the simulated only. "
             if top else "")
    return (f"<p>Every simulated layout, fastest first. {exact}Bound: the lower bound the "
            f"search used (sim.planner.bound). Front: on the Pareto front above.</p>"
            + table(rows, head=("#", "layout", "optimizer sharding", "iteration", "tokens/s",
                                "MFU", "peak memory", "bound", "front", "why", "command"),
                    classes=["front" if i in on_front else "" for i in range(len(rows))],
                    table_id="candidates"))


def _leaders_section(leaders: Sequence[tuple[Candidate, Timeline]]) -> tuple[str, go.Figure]:
    """The caption and the Gantt comparison figure of the winner and runner-up."""
    items = [(f"{name}: {c.layout.describe()}", t)
             for name, (c, t) in zip(LEADER_NAMES, leaders)]
    fig = comparison_figure(items)
    times = [t.iteration_time for _, t in leaders]
    fig.update_layout(title=dict(text="winner above runner-up: spans on one time axis"),
                      meta={**fig.layout.meta, "iteration_times": times})
    differ = [f"{name}: {format_seconds(t.iteration_time)} replayed again, "
              f"{format_seconds(c.result['iteration_time'])} in the search"
              for name, (c, t) in zip(LEADER_NAMES, leaders)
              if t.iteration_time != c.result["iteration_time"]]
    for line in differ:
        log.warning("the Gantt's replay differs from the search's: %s", line)
    caption = ("<p><b>Spans.</b> The winner's spans above the runner-up's, on one x axis "
               "(seconds since the iteration's first span); one row per pipeline rank and "
               "lane, colour by op kind, hover a bar for its op. Each title gives the "
               "layout, iteration time and bubble. Both were replayed again for their spans "
               "with the search's simulator: "
               + ("the iteration times are the table's.</p>" if not differ else
                  "<b>their times differ from the table's</b>: "
                  + escape("; ".join(differ)) + ".</p>"))
    return caption, fig


def plan_html(result: SearchResult, commands: Sequence[str], topology: nx.DiGraph, *,
              top: int | None = None, costs: CostModel | None = None,
              simulator: Simulator | None = None, bounded: Sequence[Candidate] = (),
              sweep: Mapping[int, SearchResult] | None = None) -> str:
    """The report page (module docstring) of a search's `result` and its candidates'
    `commands` on `topology`; `top`: how many the search ranked exactly; `costs`,
    `simulator`: the search's, to replay the winner and runner-up; `bounded`: candidates
    bounded out, drawn as throughput bounds; `sweep`: GPU count -> the search at that
    count, drawn against GPUs when it holds more than one."""
    title = escape(_title(result, topology))
    parts = [f"<h1>{title}</h1>"]
    first = True
    if result.candidates:
        points = [(c.result["peak_memory"], c.result["tokens_per_s"])
                  for c in result.candidates]
        on_front = set(pareto_front(points))
        fig = memory_front_figure(result.candidates, result.capacity_bytes, bounded)
        parts += ["<h2>Pareto front: throughput vs peak memory</h2><figure><figcaption>"
                  + _front_caption(result, len(bounded)) + "</figcaption>"
                  + _chart(fig, "memory-front", first) + "</figure>"]
        first = False
    if sweep and len(sweep) > 1:
        parts += ["<h2>Pareto front: throughput vs GPUs</h2><figure><figcaption><p>Every "
                  "simulated layout of each GPU count searched; red: the front (no layout "
                  "with as many tokens/s on fewer GPUs). Hover a dot for its layout and "
                  "tokens/s per GPU.</p></figcaption>"
                  + _chart(gpus_front_figure({g: r.candidates for g, r in sweep.items()}),
                           "gpus-front", first) + "</figure>"]
        first = False
    parts += ["<h2>Search funnel</h2><figure><figcaption><p>Layouts at each step of the "
              "search (the <code>--json</code> funnel's numbers): enumerated; rejected by "
              "the checks, the memory model, the lowering or the replay (reasons below); "
              "fit in memory; bounded out (their lower bound could not enter the top); "
              "simulated event by event.</p></figcaption>"
              + _chart(funnel_figure(funnel(result)), "funnel", first) + "</figure>"
              + _funnel_section(result)]
    if not result.candidates:
        parts.append("<p>No layout fits and runs: see the reasons above.</p>")
    else:
        parts += ["<h2>Candidates</h2>" + _candidates_section(result, commands, on_front, top)]
        caption, fig = _leaders_section(replay_leaders(result, topology, costs, simulator))
        parts += ["<h2>Winner and runner-up</h2><figure><figcaption>" + caption
                  + "</figcaption>" + _chart(fig, "leaders", False) + "</figure>"]
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}"
            f"</title><style>{PAGE_STYLE}</style></head><body>{''.join(parts)}</body></html>")


def write_plan_html(path: str | Path, result: SearchResult, commands: Sequence[str],
                    topology: nx.DiGraph, **options) -> Path:
    """Write the report page (atomically: schedules.output_files); `options` as
    plan_html's. Returns its path."""
    return write_text_atomic(path, plan_html(result, commands, topology, **options))
