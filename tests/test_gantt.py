import math
import re
import time
from html.parser import HTMLParser

import numpy as np
import pytest

from browser import dump_dom, png_summary, screenshot
from clustersim.schedules.registry import build_schedule
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.timeline import MemorySample, Span, Timeline
from clustersim.schedules.validate import dry_run
from clustersim.sim import gantt
from clustersim.sim.gantt import (count_bars, count_ops, gantt_figure, gantt_rows, write_gantt,
                                  write_gantt_comparison)
from clustersim.sim.units import format_bytes, format_seconds

STEP = 1e-3  # seconds per dry-run step


def pipeline_timeline(name: str = "1f1b", pp: int = 4, microbatches: int = 8) -> Timeline:
    """A realistic shape: the dry run's unit-step compute ops, P2P transfers after each
    F/B, and activation memory growing at F and shrinking at B."""
    run = dry_run(build_schedule(name, pp, microbatches))
    spans, memory = [], []
    for rank, steps in enumerate(run.steps):
        level = int(2e9)
        memory.append(MemorySample(rank, 0.0, level))
        for op, step in steps:
            start, end = step * STEP, step * STEP + 0.9 * STEP
            spans.append(Span(rank, "compute", Op(op.kind, op.stage, op.microbatch,
                                                  nbytes=4_000_000, flops=3e12), start, end))
            level += int(1e9) if op.kind is OpKind.F else -int(1e9)
            memory.append(MemorySample(rank, start if op.kind is OpKind.F else end, level))
            forward = op.kind is OpKind.F
            if forward and op.stage < pp - 1 or not forward and op.stage > 0:
                send, recv = (OpKind.SEND_F, OpKind.RECV_F) if forward else (OpKind.SEND_B,
                                                                            OpKind.RECV_B)
                peer = op.stage + (1 if forward else -1)
                spans.append(Span(rank, "send", Op(send, op.stage, op.microbatch, "pp", 8_388_608),
                                  end, end + 0.08 * STEP, {"peer": peer, "GB/s": 104.9}))
                spans.append(Span(peer, "recv", Op(recv, peer, op.microbatch, "pp", 8_388_608),
                                  end, end + 0.08 * STEP))
    return Timeline(spans, memory, meta={"plan": {"schedule": name}})


def synthetic_timeline(n: int, ranks: int = 8) -> Timeline:
    spans = []
    for i in range(n):
        rank, k = i % ranks, i // ranks
        spans.append(Span(rank, "compute", Op(OpKind.F if k % 2 == 0 else OpKind.B, rank, k),
                          k * 1e-4, k * 1e-4 + 9e-5))
    return Timeline(spans, [MemorySample(r, 0.0, 10**9) for r in range(ranks)])


class PlotDom(HTMLParser):
    """Counts what plotly drew: bar paths inside `trace bars`, lines of `trace scatter`."""

    def __init__(self):
        super().__init__()
        self.stack: list[set[str]] = []
        self.bars = 0
        self.lines = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = set((attrs.get("class") or "").split())
        self.stack.append(classes)
        inside = set().union(*self.stack[:-1]) if len(self.stack) > 1 else set()
        if tag == "path" and attrs.get("d", "").startswith("M"):
            if "bars" in inside and "point" in inside:
                self.bars += 1
            if "js-line" in classes and "scatter" in inside:
                self.lines += 1

    def handle_endtag(self, tag):
        if self.stack:
            self.stack.pop()


def test_rows_are_rank_major_with_compute_send_recv_then_axes():
    t = Timeline([
        Span(1, "dp", Op(OpKind.ALL_REDUCE, 1, None, "dp", 10), 0.0, 1.0),
        Span(1, "compute", Op(OpKind.F, 1, 0), 0.0, 1.0),
        Span(0, "recv", Op(OpKind.RECV_B, 0, 0, "pp"), 0.0, 1.0),
        Span(0, "compute", Op(OpKind.F, 0, 0), 0.0, 1.0),
        Span(0, "send", Op(OpKind.SEND_F, 0, 0, "pp"), 0.0, 1.0),
    ])
    assert gantt_rows(t) == [(0, "compute"), (0, "send"), (0, "recv"),
                             (1, "compute"), (1, "dp")]


def test_units_format_for_humans():
    assert format_seconds(2.5e-3) == "2.5 ms"
    assert format_seconds(12e-6) == "12 µs"
    assert format_seconds(1.5) == "1.5 s"
    assert format_bytes(8_388_608) == "8.39 MB"
    assert format_bytes(512) == "512 B"


def test_figure_has_one_bar_per_span_one_trace_per_kind_and_memory():
    t = pipeline_timeline()
    fig = gantt_figure(t)
    bars = [tr for tr in fig.data if tr.type == "bar"]
    assert count_bars(fig) == len(t.spans)
    assert {tr.name for tr in bars} == {s.op.kind.value for s in t.spans}
    assert all(tr.orientation == "h" for tr in bars)
    forward = next(tr for tr in bars if tr.name == "F")
    assert list(forward.base[:1]) == [0.0] and math.isclose(forward.x[0], 0.9e-3)
    memory = [tr for tr in fig.data if tr.type == "scatter"]
    assert len(memory) == 4 and all(tr.line.shape == "hv" for tr in memory)
    assert max(max(tr.y) for tr in memory) == pytest.approx(2 + 4)  # GB, 1f1b warm-up
    assert list(fig.layout.yaxis.range) == [len(gantt_rows(t)) - 0.5, -0.5]  # rank 0 on top
    assert fig.layout.xaxis.type in (None, "linear", "-")
    title = fig.layout.title.text
    assert "1f1b" in title and "ms" in title and "bubble" in title


def test_hover_shows_op_place_times_bytes_and_info():
    fig = gantt_figure(pipeline_timeline())
    send = next(tr for tr in fig.data if tr.name == "SEND_F")
    text = send.hovertext[0]
    for part in ("0SEND_F0", "rank 0", "send", "stage 0", "microbatch 0",
                 "900 µs → 980 µs (duration 80 µs)", "bytes: 8.39 MB", "peer: 1",
                 "GB/s: 104.9"):
        assert part in text, part
    assert send.text is not None and send.text[0] == "0SEND_F0"


def test_html_is_standalone(tmp_path):
    path = write_gantt(pipeline_timeline(), tmp_path / "g.html", title="my run")
    html = path.read_text()
    assert "my run" in html
    assert len(html) > 3_000_000  # plotly.js inlined
    assert not re.search(r"<script[^>]+src=", html)


def test_comparison_stacks_labelled_charts_on_one_x_axis(tmp_path):
    items = [("gpipe", pipeline_timeline("gpipe")), ("1f1b", pipeline_timeline("1f1b"))]
    fig = gantt.comparison_figure(items)
    assert count_bars(fig) == sum(len(t.spans) for _, t in items)
    assert fig.layout.xaxis.matches == "x2" or fig.layout.xaxis2.matches == "x"
    titles = [a.text for a in fig.layout.annotations]
    assert titles[0].startswith("gpipe") and titles[1].startswith("1f1b")
    legend = [tr.name for tr in fig.data if tr.showlegend is not False]
    assert len(legend) == len(set(legend))
    path = write_gantt_comparison(items, tmp_path / "cmp.html")
    assert "gpipe" in path.read_text()


def test_large_timeline_without_aggregation_switches_to_webgl_segments():
    t = synthetic_timeline(20_000)
    began = time.perf_counter()
    fig = gantt_figure(t, budget=None)
    elapsed = time.perf_counter() - began
    assert elapsed < 10
    assert fig.layout.meta["representation"] == "segments"
    assert count_bars(fig) == 0
    lines = [tr for tr in fig.data if tr.type == "scattergl" and tr.mode == "lines"]
    drawn = sum(int((~np.isnan(tr.x)).sum()) // 2 for tr in lines)
    assert drawn == len(t.spans)
    hover = [tr for tr in fig.data if tr.type == "scattergl" and tr.mode == "markers"]
    assert sum(len(tr.hovertext) for tr in hover) == len(t.spans)
    small = gantt_figure(synthetic_timeline(gantt.LARGE_TIMELINE_SPANS), budget=None)
    assert small.layout.meta["representation"] == "bars"


def test_large_timeline_is_drawn_as_few_bars_holding_every_op():
    t = synthetic_timeline(20_000)
    fig = gantt_figure(t)
    drawn = fig.layout.meta["drawn"][0]
    assert fig.layout.meta["representation"] == "bars"
    assert count_bars(fig) == drawn["bars"] <= gantt.AGGREGATE_BUDGET < drawn["spans"]
    assert count_ops(fig) == len(t.spans)
    merged = [tr for tr in fig.data if tr.type == "bar" and tr.meta["merged"]]
    assert merged and all(tr.marker.pattern.shape == "/" for tr in merged)
    assert all(0 < o <= 1 for tr in merged for o in tr.marker.opacity)
    assert all("ops in one bar" in h and "Perfetto" in h for tr in merged for h in tr.hovertext)
    assert drawn["resolution_s"] > 0
    assert not gantt_figure(synthetic_timeline(gantt.AGGREGATE_BUDGET)).layout.meta[
        "drawn"][0]["resolution_s"]  # at the budget: every span drawn as itself


def test_memory_panel_draws_the_device_memory_as_a_line():
    t = pipeline_timeline()
    t.meta["plan"].update(device_memory_bytes=80e9, device="h100-sxm")
    fig = gantt_figure(t)
    (line,) = [tr for tr in fig.data if tr.meta and tr.meta.get("device_memory")]
    assert line.name == "device memory 80.0 GB (h100-sxm)"
    assert list(line.y) == [80.0, 80.0] and line.x[0] == 0
    assert line.x[1] == pytest.approx(t.iteration_time) and line.xaxis == "x2"


@pytest.mark.browser
def test_chromium_draws_every_span_and_the_memory_curve(tmp_path):
    t = pipeline_timeline()
    dom = dump_dom(write_gantt(t, tmp_path / "g.html"), tmp_path)
    drawn = PlotDom()
    drawn.feed(dom)
    assert drawn.bars == len(t.spans)
    assert drawn.lines == len(t.ranks)  # one memory step line per rank


@pytest.mark.browser
def test_chromium_screenshot_is_not_blank(tmp_path):
    png = screenshot(write_gantt(pipeline_timeline(), tmp_path / "g.html"),
                     tmp_path / "g.png", tmp_path)
    width, height, distinct, nonzero = png_summary(png)
    assert (width, height) == (1600, 900)
    assert len(png) > 30_000
    assert distinct > 50 and nonzero > 0.01


def test_empty_and_memory_only_timelines_still_draw(tmp_path):
    assert count_bars(gantt_figure(Timeline([]))) == 0
    fig = gantt_figure(Timeline([], [MemorySample(0, 0.0, 10**9)]))
    assert [tr.type for tr in fig.data] == ["scatter"]
    assert write_gantt(Timeline([]), tmp_path / "empty.html").exists()
