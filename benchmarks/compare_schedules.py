"""GPipe vs 1F1B vs interleaved 1F1B (V = 2, 4) on Llama-3 8B on one DGX H100 node.

For each pipeline size P and microbatch count M: simulated iteration time, bubble
fraction (with the closed-form ideal (P-1)/(V*M+P-1) beside it), the most microbatch-
stages any rank holds in flight, and peak memory. Writes
benchmarks/results/compare_schedules.{md,html}.

    python benchmarks/compare_schedules.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from environment import environment_markdown
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.parallel import ParallelConfig
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

MODEL, TOPOLOGY = "llama3-8b", "dgx-h100"
PIPELINES = (2, 4, 8)
MICROBATCHES = (8, 16, 32, 64)
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4))
RESULTS = Path(__file__).parent / "results"


def run() -> list[dict]:
    model, topology = get_model(MODEL), load_topology(TOPOLOGY)
    rows = []
    for pp in PIPELINES:
        for mb in MICROBATCHES:
            for name, vpp in SCHEDULES:
                parallel = ParallelConfig(pp=pp, vpp=vpp, num_microbatches=mb, schedule=name)
                t = simulate(model, parallel, topology)
                rows.append({
                    "schedule": name if vpp == 1 else f"{name} V={vpp}", "P": pp, "M": mb,
                    "iteration_s": t.iteration_time, "bubble": t.bubble_fraction,
                    "ideal_bubble": (pp - 1) / (vpp * mb + pp - 1),
                    "peak_in_flight": max(t.peak_in_flight().values()),
                    "peak_memory_GB": max(t.peak_memory().values()) / 1e9,
                })
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| P | M | schedule | iteration (ms) | bubble | ideal bubble | peak in-flight "
             "(microbatch-stages) | peak memory (GB) |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['P']} | {r['M']} | {r['schedule']} | {r['iteration_s'] * 1e3:.1f} | "
                     f"{r['bubble']:.3f} | {r['ideal_bubble']:.3f} | {r['peak_in_flight']} | "
                     f"{r['peak_memory_GB']:.1f} |")
    return "\n".join(lines)


def figure(rows: list[dict]) -> go.Figure:
    fig = make_subplots(rows=2, cols=len(PIPELINES), shared_xaxes=True,
                        subplot_titles=[f"P={p}" for p in PIPELINES] * 2,
                        vertical_spacing=0.1)
    names = list(dict.fromkeys(r["schedule"] for r in rows))
    palette = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA"]
    for col, pp in enumerate(PIPELINES, start=1):
        for colour, name in zip(palette, names):
            mine = [r for r in rows if r["P"] == pp and r["schedule"] == name]
            xs = [r["M"] for r in mine]
            common = dict(name=name, legendgroup=name, showlegend=col == 1,
                          line=dict(color=colour))
            fig.add_trace(go.Scatter(x=xs, y=[r["bubble"] for r in mine], **common),
                          row=1, col=col)
            fig.add_trace(go.Scatter(x=xs, y=[r["peak_memory_GB"] for r in mine],
                                     **{**common, "showlegend": False}), row=2, col=col)
    fig.update_xaxes(type="log", title_text="microbatches M", row=2)
    fig.update_yaxes(title_text="bubble fraction", row=1, col=1)
    fig.update_yaxes(title_text="peak memory (GB)", row=2, col=1)
    fig.update_layout(title=f"Pipeline schedules: {MODEL} on {TOPOLOGY}", height=700)
    return fig


def main() -> int:
    rows = run()
    table = markdown(rows)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compare_schedules.md").write_text(
        f"# Pipeline schedules: {MODEL} on {TOPOLOGY} (roofline costs)\n\n"
        "Bubble = time a rank has no op running (no compute, no communication) / "
        "iteration time, averaged over ranks (Timeline.bubble_fraction); ideal = "
        "(P-1)/(V*M+P-1) for equal stages and free communication. Peak in-flight = most "
        "(stage, microbatch) activations any rank holds. Plot: compare_schedules.html.\n\n"
        + environment_markdown() + "\n\n" + table + "\n")
    figure(rows).write_html(RESULTS / "compare_schedules.html", include_plotlyjs="cdn")  # small repo
    print(table)
    print(f"wrote {RESULTS / 'compare_schedules.md'} and compare_schedules.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
