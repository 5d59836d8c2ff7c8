"""The data-parallel trade: iteration time against peak memory per DP/ZeRO/FSDP choice.

For a 7B-class model (Llama-3 8B, 16-way data parallel over 2 DGX H100 nodes of the
`dgx-h100-x16-ndr` rail cluster) and a 70B-class model (Llama-3 70B, 64-way data parallel
over 8 nodes of the `dgx-h100-x128-ndr-ft` fat-tree, full recompute), every choice below
is simulated with `clustersim simulate` (roofline compute, flow-level network) and its
model-state bytes taken from `clustersim memory`. Reported per choice: simulated
iteration time, the largest per-rank peak memory and whether it exceeds the GPU's memory
(what CUDA reports: 84.9 GB on an H100, topologies/devices.py),
model states per rank, and the data-parallel communication time on rank 0.

Writes benchmarks/results/zero_tradeoff.md, .json and .html (plot: time vs memory).

    python benchmarks/zero_tradeoff.py            # a few minutes on 2 cores
    python benchmarks/zero_tradeoff.py --render   # the .md and .html again from the .json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from environment import environment
from run_cli import ROOT, Refused, clustersim, command, measured_or_saved

from clustersim.topologies import get_device

RESULTS = ROOT / "benchmarks" / "results"
CAPACITY = get_device("h100-sxm").memory_bytes  # bytes, both clusters' GPUs
CHOICES = {
    "DDP": ("--zero", "0"),
    "ZeRO-1": ("--zero", "1"),
    "ZeRO-2": ("--zero", "2"),
    "ZeRO-3 / FSDP full shard": ("--fsdp", "full"),
    "ZeRO-3, no reshard after forward": ("--fsdp", "full", "--no-reshard-after-forward"),
    "HSDP (shard in node, replicate across)": ("--fsdp", "hybrid"),
    "ZeRO++ (qwZ + hpZ + qgZ)": ("--zero", "3", "--quantized-weights", "--hpz",
                                 "--quantized-gradients"),
    "ZeRO-2 + offload": ("--zero", "2", "--offload"),
}
MODELS = {  # title -> (flags for both commands, flags for simulate only)
    "Llama-3 8B, dp 16 on dgx-h100-x16-ndr": (
        ("--model", "llama3-8b", "--topology", "dgx-h100-x16-ndr", "--dp", "16",
         "--microbatches", "4"), ("--pp", "1")),
    "Llama-3 70B, dp 64 on dgx-h100-x128-ndr-ft, full recompute": (
        ("--model", "llama3-70b", "--topology", "dgx-h100-x128-ndr-ft", "--dp", "64",
         "--microbatches", "2", "--recompute", "full"), ("--pp", "1")),
}


def measure(work: Path) -> dict:
    rows: dict[str, list[dict]] = {}
    for title, (common, sim_only) in MODELS.items():
        sim_flags = (*common, *sim_only)
        rows[title] = []
        for name, flags in CHOICES.items():
            row = {"choice": name,
                   "command": command("simulate", *sim_flags, *flags)}
            started = time.perf_counter()
            try:
                clustersim("simulate", *sim_flags, *flags, "--metrics-json", "m.json",
                           "--timeline-json", "t.json", "-o", "g.html", cwd=work)
                memory = json.loads(clustersim("memory", *common, *flags, "--json",
                                               cwd=work).stdout)
            except Refused as failed:  # a refused combination: keep its reason
                row["error"] = str(failed).strip().splitlines()[-1]
                rows[title].append(row)
                continue
            metrics = json.loads((work / "m.json").read_text())
            timeline = json.loads((work / "t.json").read_text())
            dp_lanes = [s for s in timeline["spans"] if s["rank"] == 0
                        and s["lane"] not in ("compute", "send", "recv")]
            peaks = metrics["per_rank"]["peak_memory_bytes"]
            row.update({
                "sim_wall_s": time.perf_counter() - started,
                "iteration_time_s": metrics["iteration_time"],
                "peak_memory_bytes": max(peaks.values()),
                "oom": bool(metrics.get("meta", {}).get("oom")),
                "model_states_bytes": max(memory["model_states_bytes"]),  # per pp rank
                "dp_comm_s": sum(s["end"] - s["start"] for s in dp_lanes),
            })
            rows[title].append(row)
            print(f"{title} / {name}: {row['iteration_time_s']:.3f} s, "
                  f"{row['peak_memory_bytes'] / 1e9:.1f} GB", flush=True)
    return {"rows": rows}


def markdown(data: dict) -> str:
    env = data["environment"]
    lines = ["# DP / ZeRO / FSDP: iteration time against memory", "",
             "`python benchmarks/zero_tradeoff.py`: every choice simulated with `clustersim "
             "simulate` (roofline compute at 0.6 of peak FLOP/s, flow-level network) and "
             "measured by `clustersim memory` (ZeRO paper formulas, K = 12). GB = 1e9 bytes; "
             f"OOM = the simulated peak exceeds the H100's {CAPACITY / 1e9:.1f} GB (what CUDA "
             "reports as its total). DP comm = busy time of "
             "rank 0's data-parallel lanes (overlapped or not).", ""]
    for title, rows in data["rows"].items():
        lines += [f"## {title}", "",
                  "| choice | iteration s | peak GB | OOM | model states GB | DP comm s |",
                  "|---|---:|---:|:---:|---:|---:|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['choice']} | refused: {r['error']} | | | | |")
                continue
            lines.append(f"| {r['choice']} | {r['iteration_time_s']:.3f} | "
                         f"{r['peak_memory_bytes'] / 1e9:.1f} | {'OOM' if r['oom'] else ''} | "
                         f"{r['model_states_bytes'] / 1e9:.2f} | {r['dp_comm_s']:.3f} |")
        lines.append("")
    lines += ["Commands (one per row, as run):", ""]
    for rows in data["rows"].values():
        lines += [f"    {r['command']}" for r in rows]
    lines += ["", "Environment:", "", *[f"- {k}: {v}" for k, v in env.items()], ""]
    return "\n".join(lines)


def plot(data: dict, path: Path) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    titles = list(data["rows"])
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles)
    for col, title in enumerate(titles, start=1):
        ok = [r for r in data["rows"][title] if "error" not in r]
        fig.add_trace(go.Scatter(
            x=[r["peak_memory_bytes"] / 1e9 for r in ok], y=[r["iteration_time_s"] for r in ok],
            mode="markers+text", text=[r["choice"] for r in ok], textposition="top center",
            name=title, showlegend=False), row=1, col=col)
        fig.add_vline(x=CAPACITY / 1e9, line_dash="dash",
                      annotation_text=f"{CAPACITY / 1e9:.1f} GB", row=1, col=col)
        fig.update_xaxes(title_text="peak memory per GPU (GB)", row=1, col=col)
        fig.update_yaxes(title_text="iteration time (s)", row=1, col=col)
    fig.update_layout(title="DP / ZeRO / FSDP: time against memory (simulated)",
                      height=600, width=1400)
    fig.write_html(path, include_plotlyjs=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--render", action="store_true", help="rewrite .md/.html from .json")
    args = parser.parse_args()
    data = measured_or_saved(RESULTS / "zero_tradeoff.json", args.render, measure, environment)
    (RESULTS / "zero_tradeoff.md").write_text(markdown(data))
    plot(data, RESULTS / "zero_tradeoff.html")
    print(markdown(data))


if __name__ == "__main__":
    main()
