"""Every registered pipeline schedule on five real model / layout pairs, with and without a
memory cap: iteration time, bubble, peak memory per rank (issue 17).

For each layout below, every schedule of the registry (clustersim.schedules.registry
.SCHEDULES) is simulated with the Python API (`simulate`, roofline compute, flow-level
network) at its default vpp (V-placement schedules: 2 chunks per rank). A schedule whose
rules refuse the layout (a clean ConfigError: vpp, microbatch rules, ...) is recorded as
"refused: <reason>"; any other exception is recorded as a failure (a bug) with the last
lines of its traceback.

Without a cap: the defaults. Peak memory per rank is the simulated peak (Timeline
.peak_memory); a rank over the device memory is one of timeline.meta["oom_ranks"].
(zb-auto's search is then capped by the device memory left after model states.)

With a cap: CAP = the activation bytes 1F1B's first pipeline rank holds at its peak
(min(P, M) microbatches of stage 0), rounded up to the MB so that the `clustersim
--activation-memory-limit GB` command shown reproduces it exactly. zb-auto is rebuilt
with activation_memory_limit = CAP; every fixed schedule is checked against the same
CAP. The documented method for "peak activation bytes per rank": the timeline's
microbatch-stages in flight (F start to last B/W end, schedules.timeline.peak_in_flight),
each weighted by its stage's activation bytes per microbatch
(schedules.activation_partition.stage_activation_bytes(plan)[0], plan =
schedules.plan.resolve(model, parallel, cluster)), so chunks of interleaved and V
schedules weigh what their fewer layers keep. A schedule fits under the cap when every
pipeline rank's peak activation bytes <= CAP.

Writes benchmarks/results/schedules_all.md, .json and .html (time against memory).

    python benchmarks/schedules_all.py            # 10-20 s on 2 cores
    python benchmarks/schedules_all.py --render   # the .md and .html again from the .json
"""
from __future__ import annotations

import argparse
import math
import time
import traceback
from collections import Counter
from pathlib import Path

from environment import environment
from run_cli import ROOT, command, measured_or_saved

from clustersim.schedules.activation_partition import stage_activation_bytes
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import resolve
from clustersim.schedules.registry import SCHEDULES
from clustersim.schedules.timeline import peak_in_flight
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

RESULTS = ROOT / "benchmarks" / "results"
NAME = "schedules_all"
GB = 1e9
CAPPED = "zb-auto (capped)"
# title -> (model, topology, parallel kwargs). M is the microbatch count per pipeline.
LAYOUTS = {
    "Llama-3 8B, pp 4, M 8 on one dgx-h100 (4 GPUs)": (
        "llama3-8b", "dgx-h100", dict(pp=4, tp=1, dp=1, num_microbatches=8)),
    "Llama-3 8B, pp 4, M 16 on one dgx-h100 (4 GPUs)": (
        "llama3-8b", "dgx-h100", dict(pp=4, tp=1, dp=1, num_microbatches=16)),
    "Llama-3 70B, tp 8, pp 8, dp 2, M 16 on dgx-h100-x16-ndr (128 GPUs)": (
        "llama3-70b", "dgx-h100-x16-ndr", dict(pp=8, tp=8, dp=2, num_microbatches=16)),
    "GPT-3 175B, tp 8 + SP, pp 8, dp 2, M 12, selective recompute on dgx-h100-x16-ndr "
    "(128 GPUs)": (
        "gpt3-175b", "dgx-h100-x16-ndr",
        dict(pp=8, tp=8, dp=2, num_microbatches=12, sequence_parallel=True,
             recompute="selective")),
    "Mixtral 8x7B, tp 2, ep 4, pp 4, dp 4, M 9 on dgx-h100-x16-ndr (32 GPUs)": (
        "mixtral-8x7b", "dgx-h100-x16-ndr",
        dict(pp=4, tp=2, ep=4, dp=4, num_microbatches=9)),
}
FLAGS = {"pp": "--pp", "tp": "--tp", "dp": "--dp", "ep": "--ep", "vpp": "--vpp",
         "num_microbatches": "--microbatches", "sequence_parallel": "--sequence-parallel",
         "recompute": "--recompute", "activation_memory_limit_gb": "--activation-memory-limit"}


def cli(model: str, topology: str, schedule: str, kw: dict) -> str:
    """The `clustersim simulate` command of one row."""
    args = ["simulate", "--model", model, "--topology", topology, "--schedule", schedule]
    for key, value in kw.items():
        if value is True:
            args.append(FLAGS[key])
        elif value not in (None, False):
            args += [FLAGS[key], str(value)]
    return command(*args)


def last_lines(text: str, n: int = 4) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[-n:])


def run_one(model_name: str, topology_name: str, schedule: str, kw: dict) -> dict:
    """One simulated row (or its refusal / failure)."""
    entry = SCHEDULES[schedule]
    kw = {**kw, "vpp": entry.default_vpp}
    row = {"schedule": schedule, "vpp": kw["vpp"],
           "command": cli(model_name, topology_name, schedule, kw)}
    started = time.perf_counter()
    try:
        entry.check(kw["pp"], kw["num_microbatches"], kw["vpp"])  # the registry's rules
        model, topology = get_model(model_name), load_topology(topology_name)
        parallel = ParallelConfig.from_kwargs(schedule=schedule, **kw)
        timeline = simulate(model, parallel, topology)
        plan = resolve(model, parallel, cluster_facts(topology))
    except ConfigError as refused:
        row["refused"] = str(refused).strip().splitlines()[0]
        return row
    except Exception:  # noqa: BLE001 - any other exception is a bug: keep its traceback
        row["failed"] = last_lines(traceback.format_exc())
        return row
    stage_bytes = stage_activation_bytes(plan)[0]
    ranks = list(range(parallel.pp))  # a Timeline's ranks are the replayed pipeline ranks
    if timeline.ranks != ranks:
        row["failed"] = f"timeline ranks {timeline.ranks}, expected pipeline ranks {ranks}"
        return row
    in_flight, memory = timeline.peak_in_flight(), timeline.peak_memory()
    activations = peak_in_flight(timeline.spans, lambda op: stage_bytes[op.stage])
    bubbles = timeline.bubble_fractions()
    spans = {g: [s for s in timeline.spans if s.rank == g] for g in ranks}
    row.update({
        "sim_wall_s": time.perf_counter() - started,
        "iteration_time_s": timeline.iteration_time,
        "bubble_fraction": timeline.bubble_fraction,
        "bubble_per_rank": [bubbles.get(g, 0.0) for g in ranks],
        "rank_span_s": [max(s.end for s in spans[g]) - min(s.start for s in spans[g])
                        for g in ranks],
        "peak_memory_GB": [memory.get(g, 0) / GB for g in ranks],
        "peak_in_flight": [in_flight.get(g, 0) for g in ranks],
        "peak_activation_GB": [activations.get(g, 0) / GB for g in ranks],
        "stage_activation_GB": [b / GB for b in stage_bytes],
        "device_memory_GB": plan.cluster.memory_bytes / GB,
        "oom_pp_ranks": sorted(timeline.meta["oom_ranks"]),
        "warnings": list(timeline.meta["warnings"]),
    })
    row["fits_device"] = not row["oom_pp_ranks"]
    return row


def measure(work: Path) -> dict:
    del work  # the Python API writes no files
    layouts = {}
    for title, (model, topology, kw) in LAYOUTS.items():
        rows = [run_one(model, topology, name, kw) for name in SCHEDULES]
        for row in rows:
            print(f"{title[:24]} / {row['schedule']}: " + (
                f"{row['iteration_time_s']:.3f} s" if "iteration_time_s" in row
                else row.get("refused") or "FAILED " + row["failed"]), flush=True)
        one_f_one_b = next(r for r in rows if r["schedule"] == "1f1b")
        cap_gb = None
        if "iteration_time_s" in one_f_one_b:
            # rounded up to the MB: the CLI's GB value gives the same bytes
            cap_gb = math.ceil(one_f_one_b["peak_activation_GB"][0] * 1e3) / 1e3
            capped = run_one(model, topology, "zb-auto",
                             {**kw, "activation_memory_limit_gb": cap_gb})
            capped["schedule"] = CAPPED
            rows.append(capped)
            print(f"{title[:24]} / {CAPPED} at {cap_gb} GB: "
                  f"{capped.get('iteration_time_s', capped.get('refused'))}", flush=True)
        for row in rows:
            if "peak_activation_GB" in row and cap_gb is not None:
                row["fits_cap"] = max(row["peak_activation_GB"]) <= cap_gb + 1e-12
        layouts[title] = {"model": model, "topology": topology, "parallel": kw,
                          "cap_GB": cap_gb, "rows": rows}
    return {"layouts": layouts}


# --- rendering -----------------------------------------------------------------------

def ran(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "iteration_time_s" in r]


def asynchronous(row: dict) -> bool:
    """PipeDream and 2BW: no flush, stale weights (schedules.weight_stashing). Their time is
    a steady-state batch of a different training rule, so the 'fastest' lines leave them
    out and name them apart."""
    entry = SCHEDULES.get(row["schedule"])
    return entry is not None and entry.stashing is not None


def synchronous(rows: list[dict]) -> list[dict]:
    return [r for r in ran(rows) if not asynchronous(r)]


def label(row: dict) -> str:
    return row["schedule"] if row["vpp"] == 1 else f"{row['schedule']} (vpp={row['vpp']})"


def fmt_list(values: list[float], digits: int = 1) -> str:
    return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(layout: dict) -> list[str]:
    cap = layout["cap_GB"]
    device = next((r["device_memory_GB"] for r in ran(layout["rows"])), float("nan"))
    lines = [f"| schedule | iteration s | bubble | peak memory per rank GB | in-flight (s,mb) per rank "
             f"| peak activations GB (max rank) | fits {device:.1f} GB | fits cap "
             f"{cap} GB |", "|---|---:|---:|---|---|---:|:---:|:---:|"]
    for r in layout["rows"]:
        if "refused" in r or "failed" in r:
            why = f"refused: {r['refused']}" if "refused" in r else f"FAILED: {r['failed']}"
            lines.append(f"| {label(r)} | {cell(why)} | | | | | | |")
            continue
        oom = ("yes" if r["fits_device"] else
               "no (ranks " + ", ".join(map(str, r["oom_pp_ranks"])) + ")")
        lines.append(
            f"| {label(r)} | {r['iteration_time_s']:.3f} | {r['bubble_fraction']:.3f} | "
            f"{fmt_list(r['peak_memory_GB'])} | {r['peak_in_flight']} | "
            f"{max(r['peak_activation_GB']):.2f} | {oom} | "
            f"{'yes' if r.get('fits_cap') else 'no'} |")
    return lines


def best(rows: list[dict], key: str = "iteration_time_s") -> dict | None:
    return min(rows, key=lambda r: r[key]) if rows else None


def summary(layout: dict) -> list[str]:
    """What wins where, computed from the rows (synchronous schedules; the asynchronous
    ones on a line of their own)."""
    rows = synchronous(layout["rows"])
    out = []
    fastest = best(rows)
    if fastest is None:
        return ["- nothing ran"]
    out.append(f"- fastest: {label(fastest)}, {fastest['iteration_time_s']:.3f} s "
               f"(bubble {fastest['bubble_fraction']:.3f}, "
               f"{'fits' if fastest['fits_device'] else 'exceeds'} device memory)")
    fit = best([r for r in rows if r["fits_device"]])
    out.append("- fastest that fits device memory: " + (
        f"{label(fit)}, {fit['iteration_time_s']:.3f} s" if fit else "none"))
    under = best([r for r in rows if r.get("fits_cap") and r["fits_device"]])
    out.append(f"- fastest that fits both device memory and the cap ({layout['cap_GB']} GB of "
               "activations per rank): " + (
                   f"{label(under)}, {under['iteration_time_s']:.3f} s" if under else "none"))
    lowest = best(rows, "bubble_fraction")
    out.append(f"- lowest bubble: {label(lowest)}, {lowest['bubble_fraction']:.3f}")
    by = {r["schedule"]: r for r in rows}
    if "1f1b" in by and CAPPED in by:
        base, cap = by["1f1b"], by[CAPPED]
        out.append(f"- zb-auto under 1F1B's activation memory: "
                   f"{cap['iteration_time_s']:.3f} s against 1F1B's "
                   f"{base['iteration_time_s']:.3f} s "
                   f"({base['iteration_time_s'] / cap['iteration_time_s']:.2f}x), "
                   f"in flight {cap['peak_in_flight']} against {base['peak_in_flight']}")
        if not cap["fits_device"]:
            out.append(f"- zb-auto (capped) exceeds device memory on ranks "
                       f"{', '.join(map(str, cap['oom_pp_ranks']))}: the cap bounds "
                       f"activations only, and 1F1B, whose activations set it, "
                       f"{'fits' if base['fits_device'] else 'exceeds device memory too'} "
                       f"(rank 0 {base['peak_memory_GB'][0]:.1f} GB)")
    stale = [r for r in ran(layout["rows"]) if asynchronous(r)]
    if stale and "1f1b" in by:
        out.append("- asynchronous, stale weights (not in the lines above): " + ", ".join(
            f"{label(r)} {r['iteration_time_s']:.3f} s "
            f"({by['1f1b']['iteration_time_s'] / r['iteration_time_s']:.2f}x 1F1B, bubble "
            f"{r['bubble_fraction']:.3f}, {'fits' if r['fits_device'] else 'exceeds'} "
            f"device memory)" for r in stale)
            + ": their steady-state batch, no flush, weight updates applied 1 (2BW) or up to "
              "pp - 1 (PipeDream) updates late")
    refused = [r["schedule"] for r in layout["rows"] if "refused" in r]
    if refused:
        out.append(f"- refused here: {', '.join(refused)}")
    return out


def overall(data: dict) -> list[str]:
    layouts = data["layouts"].values()
    counts = {key: Counter() for key in ("fastest", "fits", "cap")}
    for layout in layouts:
        rows = synchronous(layout["rows"])
        for key, pool in (("fastest", rows), ("fits", [r for r in rows if r["fits_device"]]),
                          ("cap", [r for r in rows if r.get("fits_cap") and r["fits_device"]])):
            if pool:
                counts[key][label(best(pool))] += 1
    n = len(data["layouts"])

    def said(c: Counter) -> str:
        return ", ".join(f"{k} in {v} of {n}" for k, v in c.most_common()) or "none"

    return [f"- fastest overall (synchronous schedules; PipeDream and 2BW per layout below): "
            f"{said(counts['fastest'])}",
            f"- fastest among those that fit device memory: {said(counts['fits'])}",
            f"- fastest among those that fit device memory and the cap: {said(counts['cap'])}"]


def notes(data: dict) -> list[str]:
    out = []
    pairs: dict[str, list[str]] = {}  # the run's note, without its pair count -> layouts
    for title, layout in data["layouts"].items():
        for r in ran(layout["rows"]):
            if r["schedule"] == "dualpipev":
                for w in r["warnings"]:
                    if "F then B" in w:
                        pairs.setdefault(w.split(" ", 1)[1], []).append(
                            f"{title.split(' on ')[0]}: {w.split(' ', 1)[0]}")
    if pairs:
        out.append("- dualpipev: its overlapped forward-backward pairs are simulated F then B "
                   "(one after the other, not overlapped). The runs say:")
        for note, where in pairs.items():
            out.append(f"    - \"N {note}\" (N = {'; '.join(where)})")
    out.append("- zb-h2: its iteration time here is one iteration, first op to last op over "
               "all ranks. ZB-H2's per-rank spans form a parallelogram (rank r starts about "
               "r T_F late), so its zero bubble is the steady state of back-to-back iterations "
               "once the optimizer step's synchronisation is removed, not one iteration; with "
               "T_F = T_I = T_W one iteration of ZB-H2 takes as long as ZB-H1's "
               "(schedules/pipelines/zero_bubble.py). Per layout:")
    for title, layout in data["layouts"].items():
        by = {r["schedule"]: r for r in ran(layout["rows"])}
        if "zb-h2" in by and "zb-h1" in by:
            h1, h2 = by["zb-h1"], by["zb-h2"]
            out.append(
                f"    - {title}: zb-h2 {h2['iteration_time_s']:.3f} s (zb-h1 "
                f"{h1['iteration_time_s']:.3f} s); zb-h2's longest own span of a rank "
                f"{max(h2['rank_span_s']):.3f} s; bubble per rank "
                f"{fmt_list(h2['bubble_per_rank'], 3)}")
    out.append("- M = 12 with pp 8 (GPT-3) and M = 9 with pp 4 (Mixtral) are chosen so that "
               "the registry's rules refuse some schedules (interleaved-1f1b: M a multiple of "
               "pp; dualpipev: M >= 2pp; interleaved-zero-bubble: equal rounds).")
    out.append("- zb-auto (uncapped) is built per run from the run's own simulated F/I/W costs; "
               "its search is then capped by the device memory left after model states, so it "
               "may hold more than 1F1B. The capped row rebuilds it under the cap.")
    out.append("- Bubble = time a rank has no op running / iteration time, averaged over "
               "pipeline ranks (Timeline.bubble_fraction); the optimizer step and "
               "data-parallel collectives are inside the iteration.")
    out.append("- Only the ranks of replica 0 are replayed (one per pipeline rank); the others "
               "are assumed identical. Memory per rank: pipeline ranks 0..P-1. GB = 1e9 B.")
    return out


def markdown(data: dict) -> str:
    env = data["environment"]
    lines = [f"# Every pipeline schedule on {len(data['layouts'])} model layouts, with and "
             "without a memory cap", "",
             "`python benchmarks/schedules_all.py` (Python API: `simulate`, roofline compute, "
             "flow-level network). Each schedule at its registry default vpp. Peak memory = "
             "the simulated peak per pipeline rank; fits = no rank over the device memory "
             "(timeline.meta['oom_ranks']). Cap = the activation bytes 1F1B's rank 0 holds "
             "(rounded up to the MB): zb-auto (capped) is built with "
             "`--activation-memory-limit CAP`; fits cap = every rank's peak activations "
             "(microbatch-stages in flight x their stage's activation bytes per microbatch) "
             "<= CAP. Plot: schedules_all.html. Simulated on this machine in "
             f"{data['wall_s']:.0f} s.", ""]
    lines += ["## Summary", "", *overall(data), ""]
    for title, layout in data["layouts"].items():
        lines += [f"## {title}", "", *table(layout), "", *summary(layout), ""]
    lines += ["## Notes", "", *notes(data), ""]
    lines += ["## Commands (one per row, as simulated)", ""]
    for layout in data["layouts"].values():
        lines += [f"    {r['command']}" for r in layout["rows"]]
    lines += ["", "## Environment", "", *[f"- {k}: {v}" for k, v in env.items()], ""]
    return "\n".join(lines)


def plot(data: dict, path: Path) -> None:
    """Per layout, iteration time against the largest rank's peak memory (top, device
    memory as a line) and peak activations (bottom, the cap as a line); one point per
    schedule, an x where a rank exceeds device memory. Naive (several times slower) is
    left off the y range and named in the subplot instead."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots
    titles = list(data["layouts"])
    short = [t.split(" on ")[0] for t in titles]
    fig = make_subplots(rows=2, cols=len(titles), subplot_titles=short * 2,
                        vertical_spacing=0.14, horizontal_spacing=0.04)
    names = list(SCHEDULES) + [CAPPED]
    colour = dict(zip(names, qualitative.Dark24))
    for name in names:  # legend entries, one per schedule, as circles
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 legendgroup=name, marker=dict(size=10, color=colour[name])),
                      row=1, col=1)
    for col, title in enumerate(titles, start=1):
        layout = data["layouts"][title]
        rows = ran(layout["rows"])
        shown = [r for r in rows if r["schedule"] != "naive"] or rows
        times = [r["iteration_time_s"] for r in shown]
        pad = 0.08 * (max(times) - min(times) or max(times))
        off = [r for r in rows if r not in shown]
        for row_i, (x_key, line, text) in enumerate(
                (("peak_memory_GB", None, "device memory"),
                 ("peak_activation_GB", layout["cap_GB"], "cap")), start=1):
            for r in shown:
                fig.add_trace(go.Scatter(
                    x=[max(r[x_key])], y=[r["iteration_time_s"]], mode="markers",
                    marker=dict(size=11, color=colour.get(r["schedule"]),
                                symbol="circle" if r["fits_device"] else "x"),
                    name=r["schedule"], legendgroup=r["schedule"], showlegend=False,
                    hovertext=f"{label(r)}: {r['iteration_time_s']:.3f} s, bubble "
                              f"{r['bubble_fraction']:.3f}, peak memory "
                              f"{fmt_list(r['peak_memory_GB'])} GB, in flight "
                              f"{r['peak_in_flight']}", hoverinfo="text"), row=row_i, col=col)
            x = line if line is not None else next(
                (r["device_memory_GB"] for r in rows), None)
            if x is not None:
                fig.add_vline(x=x, line_dash="dash", annotation_text=f"{text} {x:.0f} GB",
                              row=row_i, col=col)
            fig.update_yaxes(range=[min(times) - pad, max(times) + pad], row=row_i, col=col)
            if off:
                axis = "" if (row_i, col) == (1, 1) else str((row_i - 1) * len(titles) + col)
                fig.add_annotation(
                    text=", ".join(f"{r['schedule']}: {r['iteration_time_s']:.2f} s "
                                   "(off the chart)" for r in off),
                    xref=f"x{axis} domain", yref=f"y{axis} domain", x=0.02, y=0.02,
                    showarrow=False, xanchor="left", font=dict(size=10))
        fig.update_xaxes(title_text="peak memory, max rank (GB)", row=1, col=col)
        fig.update_xaxes(title_text="peak activations, max rank (GB)", row=2, col=col)
    fig.update_yaxes(title_text="iteration time (s)", col=1)
    fig.update_layout(
        title="Pipeline schedules: iteration time against peak memory (simulated). Top: "
              "total memory vs device memory. Bottom: activations vs the cap (1F1B rank 0's "
              "activations; zb-auto (capped) is built under it)",
        legend_title_text="o fits device memory, x exceeds it", height=900, width=2200)
    fig.write_html(path, include_plotlyjs=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--render", action="store_true", help="rewrite .md/.html from .json")
    args = parser.parse_args()
    started = time.perf_counter()

    def timed(work: Path) -> dict:
        data = measure(work)
        data["wall_s"] = time.perf_counter() - started
        return data

    data = measured_or_saved(RESULTS / f"{NAME}.json", args.render, timed, environment)
    (RESULTS / f"{NAME}.md").write_text(markdown(data))
    plot(data, RESULTS / f"{NAME}.html")
    print(markdown(data))


if __name__ == "__main__":
    main()
