"""Collectives: simulated bus bandwidth vs size per topology preset, and the simulator's
own cost on 1024 GPUs.

Part 1 sweeps every op from 8 B to 8 GiB (x4 steps) with the default algorithm choice on
one 8-GPU node (DGX A100, DGX H100), 16 DGX H100 on rail-optimized NDR (128 GPUs) and 128
DGX H100 on a non-blocking NDR fat-tree (1024 GPUs); busbw in GB/s (1e9 B/s) as
nccl-tests prints it. Part 2 times a 1024-GPU ring all-reduce and all-to-alls of growing
size (wall time, flows, flows/s; best of --repeat) and profiles where an all-to-all's
time goes. Writes benchmarks/results/collectives.md and collectives.html.

    python benchmarks/collectives.py [--repeat 3] [--quick]
"""
from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import sys
import time
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from environment import environment_markdown
from clustersim.sim.collectives import Collective, simulate_collective, sweep_collective
from clustersim.topologies import gpu_nodes, load_topology

PRESETS = ["dgx-a100", "dgx-h100", "dgx-h100-x16-ndr", "dgx-h100-x128-ndr-ft"]
OPS = [Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
       Collective.BROADCAST, Collective.ALL_TO_ALL]
SIZES = [8 * 4 ** k for k in range(16)]  # 8 B .. 8 GiB
MAX_ALL_TO_ALL_RANKS = 128  # 1024 ranks = 1M flows: see part 2
SHORT = {"ring": "r", "tree": "t", "multi-ring": "m", "hierarchical": "h", "direct": "d",
         "nvls": "n", "nvls-tree": "nt", "pat": "p", "collnet-chain": "c"}


def label(algorithm: str) -> str:
    """'r LL128' for NCCL's 'ring/LL128', 'd' for 'direct'."""
    name, _, protocol = algorithm.partition("/")
    return f"{SHORT[name]} {protocol}".rstrip()
RESULTS = Path(__file__).parent / "results"
log = logging.getLogger("collectives")


def human(size: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return str(size)


def bandwidth_sweeps(sizes: list[int]) -> dict[str, dict[Collective, list]]:
    sweeps: dict[str, dict[Collective, list]] = {}
    for preset in PRESETS:
        graph = load_topology(preset)
        ranks = len(gpu_nodes(graph))
        sweeps[preset] = {}
        for op in OPS:
            if op is Collective.ALL_TO_ALL and ranks > MAX_ALL_TO_ALL_RANKS:
                continue
            start = time.perf_counter()
            sweeps[preset][op] = sweep_collective(op, sizes, ranks, graph)
            log.info("%s %s: %.2f s", preset, op.value, time.perf_counter() - start)
    return sweeps


def sweep_tables(sweeps, sizes) -> list[str]:
    lines = []
    for preset, by_op in sweeps.items():
        graph = load_topology(preset)
        lines += [f"### {preset} ({len(gpu_nodes(graph))} GPUs)", "",
                  "| size | " + " | ".join(op.value for op in OPS) + " |",
                  "|---:|" + "---:|" * len(OPS)]
        for i, size in enumerate(sizes):
            cells = [f"{by_op[op][i].busbw / 1e9:.1f} {label(by_op[op][i].algorithm)}"
                     if op in by_op else "—" for op in OPS]
            lines.append(f"| {human(size)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def write_html(sweeps, path: Path) -> None:
    fig = make_subplots(rows=2, cols=2, subplot_titles=list(sweeps), horizontal_spacing=0.08,
                        vertical_spacing=0.12)
    colours = ["#7B4EA3", "#1F77B4", "#2CA02C", "#FF7F0E", "#D62728"]
    for k, (preset, by_op) in enumerate(sweeps.items()):
        row, col = k // 2 + 1, k % 2 + 1
        for op, colour in zip(OPS, colours):
            if op not in by_op:
                continue
            results = by_op[op]
            fig.add_trace(go.Scatter(
                x=[r.nbytes for r in results], y=[r.busbw / 1e9 for r in results],
                mode="lines+markers", name=op.value, legendgroup=op.value, showlegend=k == 0,
                line=dict(color=colour),
                text=[f"{r.algorithm}, {r.time_s * 1e6:.2f} us" for r in results],
                hovertemplate="%{x} B: busbw %{y:.1f} GB/s (%{text})"), row=row, col=col)
        fig.update_xaxes(type="log", title_text="size (B)", row=row, col=col)
        fig.update_yaxes(title_text="busbw (GB/s)", row=row, col=col)
    fig.update_layout(title="Simulated bus bandwidth vs size (default algorithm)",
                      height=800, width=1200)
    fig.write_html(path, include_plotlyjs="cdn")


def best_wall(fn, repeat: int):
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def cost_rows(repeat: int, a2a_ranks: list[int]) -> list[str]:
    graph = load_topology("dgx-h100-x128-ndr-ft")
    cases = [("all-reduce", 1024, "ring"), ("all-reduce", 1024, None)]
    cases += [("all-to-all", n, None) for n in a2a_ranks]
    lines = ["| op | GPUs | algorithm | first call (s) | best (s) | flows | flows/s (best) "
             "| simulated time |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for op, ranks, algorithm in cases:
        def run():
            return simulate_collective(op, 1 << 30, ranks, graph, algorithm)
        first, r = best_wall(run, 1)
        runs = 1 if op == "all-to-all" and ranks > 128 else repeat - 1
        best = min(first, best_wall(run, runs)[0]) if runs > 0 else first
        chosen = algorithm or f"auto → {r.algorithm}"
        lines.append(f"| {op} | {ranks} | {chosen} | {first:.3f} | {best:.3f} | {r.flows} | "
                     f"{r.flows / best:,.0f} | {r.time_s * 1e3:.3f} ms |")
        log.info("%s %d: first %.3f s, best %.3f s", op, ranks, first, best)
    return lines


def profile_rows(ranks: int) -> list[str]:
    """Own time of one all-to-all under cProfile, grouped by where it is spent."""
    graph = load_topology("dgx-h100-x128-ndr-ft")
    profiler = cProfile.Profile()
    profiler.enable()
    simulate_collective("all-to-all", 1 << 30, ranks, graph)
    profiler.disable()
    stats = pstats.Stats(profiler)
    groups: dict[str, float] = {}
    for (file, _, name), (_, _, own, _, _) in stats.stats.items():
        path = file.replace("\\", "/")
        if "topologies/routing" in path:
            key = "routing: topologies.routes (equal-cost path search)"
        elif "sim/flows" in path and name in ("path_links", "least_loaded", "<listcomp>",
                                              "<genexpr>"):
            key = "sim.flows path choice + path -> link ids (path_links, least_loaded)"
        elif "sim/flows" in path:
            key = "sim.flows bookkeeping (components, heap, timers)"
        elif "sim/maxmin" in path or "numpy" in path:
            key = "max-min rates (sim.maxmin, numpy)"
        elif "simpy" in path:
            key = "SimPy events"
        elif "sim/collective" in path:
            key = "sim.collectives (phases, spans)"
        else:
            key = "other (builtins: dict/set/list operations, ...)"
        groups[key] = groups.get(key, 0.0) + own
    total = stats.total_tt
    lines = [f"Where one {ranks}-GPU all-to-all spends its time ({total:.1f} s under "
             "cProfile, own time grouped):", "", "| where | s | share |", "|---|---:|---:|"]
    for key, own in sorted(groups.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {key} | {own:.2f} | {own / total:.0%} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer sizes, smaller all-to-alls")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sizes = SIZES[::3] if args.quick else SIZES
    sweeps = bandwidth_sweeps(sizes)
    a2a_ranks = [64, 128] if args.quick else [64, 128, 256]
    cost = cost_rows(args.repeat, a2a_ranks)
    profile = profile_rows(64 if args.quick else 128)
    RESULTS.mkdir(exist_ok=True)
    write_html(sweeps, RESULTS / "collectives.html")
    text = "\n".join([
        "# Collectives: simulated bus bandwidth and simulator cost", "",
        environment_markdown(), "",
        "Produced by `python benchmarks/collectives.py`. Sizes and busbw follow nccl-tests "
        "(doc/PERFORMANCE.md); GB/s = 1e9 B/s; sizes binary (1G = 2^30 B). Each cell is "
        "busbw and the algorithm (and NCCL protocol) the default rule chose: NCCL's tuner "
        "on these CUDA GPUs (r ring, t tree, n NVLS, nt NVLS-tree, p PAT; LL, LL128, "
        "Simple), d direct for all-to-all. Plot: `collectives.html`.", "",
        "## Bus bandwidth vs size (GB/s)", "",
        *sweep_tables(sweeps, sizes),
        f"All-to-all is not swept on more than {MAX_ALL_TO_ALL_RANKS} GPUs: 1024 GPUs is "
        "1,047,552 flows per size (see the cost below).", "",
        "## Simulator cost (1 GiB, dgx-h100-x128-ndr-ft)", "",
        f"Best of {args.repeat} runs (256-GPU all-to-all: one). `auto` includes the "
        "alpha-beta estimate of every applicable algorithm; its first call on a graph finds "
        "their routes (cached per graph), later calls do not.", "",
        *cost, "",
        *profile, "",
    ])
    (RESULTS / "collectives.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
