"""The HTML report (sim.html_report): what a real browser shows, the GPUs each row names,
the merged bars' conservation of op time, and the size of a large run's page."""
import json
from collections import Counter, defaultdict
from html import unescape
from pathlib import Path

import plotly.offline
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from browser import dump_dom
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import header_line, resolve
from clustersim.schedules.timeline import MemorySample, Span, Timeline, span_category
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.gantt import AGGREGATE_BUDGET, count_ops, gantt_figure
from clustersim.sim.headline import headline
from clustersim.sim.html_report import report_html, write_report
from clustersim.sim.rank_gpus import rank_gpus
from clustersim.sim.simulate import simulate
from clustersim.sim.span_groups import aggregate, group_spans, resolution_ladder
from clustersim.sim.units import format_seconds
from clustersim.topologies import load_topology

# Reads what the browser laid out once the page's scripts ran: element boxes and their
# rendered text (innerText is empty for what is not displayed), the Gantt's drawn bars,
# the row names plotly drew on the y axis and the legend's entries.
FACTS = """<script>window.addEventListener('load', () => {
  const box = (sel) => { const e = document.querySelector(sel); if (!e) return null;
    const r = e.getBoundingClientRect();
    return {top: r.top, height: r.height, text: e.innerText}; };
  const texts = (sel) => [...document.querySelectorAll(sel)].map(e => e.textContent);
  document.body.setAttribute('data-facts', JSON.stringify({
    banner: box('#oom-banner'), plan: box('#plan'), headline: box('#headline'),
    ranks: box('#ranks'), gantt: box('#gantt'),
    bars: document.querySelectorAll('#gantt .bars .point').length,
    rows: texts('#gantt .ytick text'), legend: texts('#gantt .legendtext')}));
});</script>"""


@pytest.fixture(scope="module")
def fits() -> Timeline:
    """Llama-3 8B, tp 2, pp 2, dp 2 on one DGX H100: every rank fits in 80 GB."""
    return simulate(get_model("llama3-8b"), ParallelConfig(tp=2, pp=2, dp=2, num_microbatches=4),
                    load_topology("dgx-h100"))


@pytest.fixture(scope="module")
def does_not_fit() -> Timeline:
    """Llama-3 70B over 2 pipeline ranks x 4 data-parallel replicas: hundreds of GB a GPU."""
    return simulate(get_model("llama3-70b"), ParallelConfig(pp=2, dp=4, num_microbatches=2),
                    load_topology("dgx-h100"))


def browser_facts(timeline: Timeline, tmp_path: Path) -> dict:
    html = report_html(timeline)
    head, _, tail = html.rpartition("</body>")
    page = tmp_path / "report.html"
    page.write_text(head + FACTS + "</body>" + tail)
    dom = dump_dom(page, tmp_path)
    start = dom.index('data-facts="') + len('data-facts="')
    return json.loads(unescape(dom[start:dom.index('"', start)]))


@pytest.mark.browser
def test_report_opens_with_the_plan_and_headline_numbers_then_the_chart(fits, tmp_path):
    facts = browser_facts(fits, tmp_path)
    plan = fits.meta["plan"]
    assert facts["banner"] is None
    assert header_line(plan) in facts["plan"]["text"]
    assert f"{plan['world_size']} GPUs of h100-sxm, 84.9 GB each" in facts["plan"]["text"]
    shown = facts["headline"]["text"]
    figures = fits.meta["throughput"]
    for number in (format_seconds(fits.iteration_time), f"{figures['tokens_per_s']:,.0f} tokens/s",
                   f"{figures['mfu']:.1%}", f"{fits.bubble_fraction:.1%}"):
        assert number in shown, number
    assert all(facts[k]["height"] > 0 for k in ("plan", "headline", "ranks", "gantt"))
    assert facts["plan"]["top"] < facts["headline"]["top"] < facts["gantt"]["top"]
    assert facts["bars"] == len(fits.spans)  # a small run: every span drawn
    assert "device memory 84.9 GB (h100-sxm)" in facts["legend"]


@pytest.mark.browser
def test_oom_banner_opens_the_page_of_a_run_that_does_not_fit(does_not_fit, tmp_path):
    facts = browser_facts(does_not_fit, tmp_path)
    over = does_not_fit.meta["oom_ranks"]
    assert over  # the memory model says it does not fit
    banner = facts["banner"]
    assert banner is not None and banner["height"] > 0
    assert banner["top"] < facts["plan"]["top"] and banner["top"] < 900  # first screen
    assert "Out of memory" in banner["text"] and "84.9 GB" in banner["text"]
    peaks = does_not_fit.peak_memory()
    for rank in over:
        gpu = does_not_fit.meta["plan"]["devices"][rank]
        assert f"rank {rank} ({gpu}" in banner["text"]
        assert f"peak {peaks[rank] / 1e9:.1f} GB" in banner["text"]


def test_no_banner_and_oom_ranks_agree_with_the_simulation(fits, does_not_fit):
    assert 'id="oom-banner"' not in report_html(fits)
    for timeline in (fits, does_not_fit):
        assert headline(timeline.metrics())["oom_ranks"] == timeline.meta["oom_ranks"]


@pytest.mark.parametrize("order, stands_for", [
    # Megatron's order: pp outermost, pipeline rank r holds global ranks r*W/P .. (r+1)*W/P-1
    ("tp-cp-ep-dp-pp", lambda r, world, pp: set(range(r * world // pp, (r + 1) * world // pp))),
    # pp innermost: pipeline rank r holds every global rank g with g % P == r
    ("pp-tp-cp-ep-dp", lambda r, world, pp: set(range(r, world, pp)))])
def test_each_row_names_the_gpus_it_stands_for(order, stands_for):
    parallel = ParallelConfig(tp=2, pp=4, dp=2, num_microbatches=4, rank_order=order)
    cluster = cluster_facts(load_topology("dgx-h100-x16-ndr"))
    plan = resolve(get_model("llama3-8b"), parallel, cluster)
    gpus = rank_gpus(plan.describe())
    assert sorted(gpus) == list(range(4))
    for r, row in gpus.items():
        assert set(row.stands_for) == stands_for(r, 16, 4)
        assert row.gpu == plan.devices[r] == f"gpu{row.global_rank}"
        assert row.label == f"rank {r} · {row.gpu} +3"
    covered = [g for row in gpus.values() for g in row.stands_for]
    assert sorted(covered) == list(range(16))  # every GPU of the job once


def test_rows_and_hover_carry_gpu_ids(fits):
    fig = gantt_figure(fits)
    ticks = list(fig.layout.yaxis.ticktext)
    assert "rank 0 · gpu0 +3 · compute" in ticks and "rank 1 · gpu4 +3 · compute" in ticks
    hover = [h for tr in fig.data if tr.type == "bar" for h in tr.hovertext
             if "· rank 1 ·" in h]
    assert hover and all("gpu4 (global rank 4); stands for gpu4–gpu7: 4 GPUs" in h
                         for h in hover)


def _spans(draw_ops) -> list[Span]:
    return [Span(rank, lane, Op(kind, rank, i), start, start + duration)
            for i, (rank, lane, kind, start, duration) in enumerate(draw_ops)]


SPAN_OPS = st.lists(st.tuples(
    st.integers(0, 2), st.sampled_from(["compute", "send", "tp"]),
    st.sampled_from([OpKind.F, OpKind.B, OpKind.SEND_F, OpKind.ALL_GATHER]),
    st.floats(0, 1, allow_nan=False), st.floats(0, 0.05, allow_nan=False)), max_size=200)


@settings(max_examples=60, deadline=None)
@given(SPAN_OPS, st.floats(1e-4, 0.2))
def test_merged_bars_conserve_each_rows_op_time(ops, resolution):
    spans = _spans(ops)
    groups = group_spans(spans, resolution)
    assert sorted(id(s) for g in groups for s in g.spans) == sorted(map(id, spans))
    busy: dict[tuple, float] = defaultdict(float)
    for g in groups:
        assert len({(s.rank, s.lane, span_category(s)) for s in g.spans}) == 1
        assert g.start <= min(s.start for s in g.spans) and g.end == max(s.end for s in g.spans)
        if len(g.spans) > 1:
            assert all(s.duration < resolution for s in g.spans)
        for kind, seconds in g.op_time().items():
            busy[(g.rank, g.lane, kind)] += seconds
    expected: dict[tuple, float] = defaultdict(float)
    for s in spans:
        expected[(s.rank, s.lane, s.op.kind.value)] += s.duration
    assert busy.keys() == expected.keys()
    assert all(busy[k] == pytest.approx(expected[k], abs=1e-12) for k in expected)


def pipeline_like(ranks: int = 16, steps: int = 600) -> Timeline:
    """A 175B-like shape: per rank a busy compute lane of F/B ops with a TP all-gather and
    reduce-scatter before each, and a send and a receive after each (5 spans a step)."""
    spans, memory = [], []
    for r in range(ranks):
        t = r * 2e-3
        for m in range(steps):
            kind = OpKind.F if m % 2 == 0 else OpKind.B
            length = 5e-3 if kind is OpKind.F else 11e-3
            spans += [Span(r, "tp", Op(OpKind.ALL_GATHER, r, m, "tp", 8 << 20), t, t + 6e-4),
                      Span(r, "tp", Op(OpKind.REDUCE_SCATTER, r, m, "tp", 8 << 20),
                           t + 6e-4, t + 1.2e-3),
                      Span(r, "compute", Op(kind, r, m, flops=1e12), t + 1.2e-3,
                           t + 1.2e-3 + length)]
            end = t + 1.2e-3 + length
            spans += [Span(r, "send", Op(OpKind.SEND_F, r, m, "pp", 1 << 20), end, end + 1e-4),
                      Span(r, "recv", Op(OpKind.RECV_F, r, m, "pp", 1 << 20), end, end + 1e-4)]
            memory.append(MemorySample(r, t, 10**10 + m % 40 * 10**8))
            t = end + 2e-4
    return Timeline(spans, memory, meta={"plan": {"schedule": "1f1b"}})


# Bound on the page beyond plotly.js: AGGREGATE_BUDGET (4,000) bars at <= 400 bytes each
# (hover text of 250-350 characters and four base64 numbers) is 1.6 MB, plus the tables,
# captions and memory curves (tens of kB): 2.5 MB is "a few MB beyond plotly.js" (issue 18)
# with room for longer hover text. Every span drawn (budget=None), this page is 15.5 MB.
PAGE_BOUND_BEYOND_PLOTLY = 2_500_000


def test_a_large_runs_page_stays_under_its_bound(tmp_path):
    timeline = pipeline_like()
    fig = gantt_figure(timeline)
    drawn = fig.layout.meta["drawn"][0]
    assert drawn["spans"] == len(timeline.spans) == 48_000
    assert drawn["bars"] <= AGGREGATE_BUDGET and count_ops(fig) == len(timeline.spans)
    page = write_report(timeline, tmp_path / "large.html")
    beyond = page.stat().st_size - len(plotly.offline.get_plotlyjs().encode())
    assert 0 < beyond <= PAGE_BOUND_BEYOND_PLOTLY
    text = page.read_text()
    assert "Aggregated:" in text and f"{len(timeline.spans):,} spans are drawn as" in text
    assert "--trace-json PATH" in text  # where every op is
    kinds = Counter(s.op.kind.value for s in timeline.spans)
    assert {tr.name for tr in fig.data if tr.type == "bar"} <= set(kinds)


def test_aggregation_picks_the_finest_resolution_within_the_budget():
    spans = pipeline_like(ranks=4, steps=400).spans
    extent = max(s.end for s in spans) - min(s.start for s in spans)
    ladder = resolution_ladder(extent)
    groups, resolution = aggregate(spans, extent, 1000)
    assert len(groups) <= 1000 < len(spans)
    finer = ladder.index(resolution) + 1
    assert finer == len(ladder) or len(group_spans(spans, ladder[finer])) > 1000
    assert aggregate(spans, extent, 10)[1] == ladder[0]  # none fits: the coarsest
    assert aggregate(spans, extent, len(spans))[1] == 0  # within the budget: as it is
