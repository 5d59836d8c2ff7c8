"""Megatron's 1D tensor parallelism against Optimus' 2D (SUMMA), Tesseract's 2.5D and
Colossal-AI's 3D on real models (issue 17).

For each layout below, each tensor-parallel mode is simulated with the Python API
(`simulate`, roofline compute, flow-level network): 1D (Megatron, activations replicated
between the linears), 1D with sequence parallelism, 2D (`tp_mode='2d'`, tp = q^2), 2.5D
(`tp_mode='2.5d'`, tp = d q^2 with the smallest depth d >= 2 that fits) and 3D
(`tp_mode='3d'`, tp = q^3); a mode whose grid does not fit the layout's tp is refused
(schedules/tp_grid.py). Reported per mode: iteration time, the mean exposed TP
communication per rank (the time breakdown's 'tp'), the largest peak memory per rank, and
the closed-form elements one rank moves in one layer's forward: 1D's two ring all-reduces of
T h elements, 4 (t-1)/t T h (SP's all-gathers and reduce-scatters move the same); 2D's
SUMMA broadcasts, sum over the layer's linears of (T h_in + h_in h_out) / q
(schedules/tp_2d.py; Optimus' (7 T h + 12 h^2) / q for GPT), with T / d for 2.5D; and 3D's
ring all-gathers and reduce-scatters, (q-1)/q^3 sum (T h_in + T h_out + h_in h_out)
(schedules/tp_3d.py). T = micro-batch tokens.

Writes benchmarks/results/tp_modes.md and .json.

    python benchmarks/tp_modes.py            # under a minute on 2 cores
    python benchmarks/tp_modes.py --render   # the .md again from the .json
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace

from environment import environment
from run_cli import ROOT, measured_or_saved

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.tp_grid import layer_linears
from clustersim.sim.simulate import simulate
from clustersim.topologies import load_topology

RESULTS = ROOT / "benchmarks" / "results"
NAME = "tp_modes"
MODES = {"1D": {}, "1D + SP": {"sequence_parallel": True}, "2D": {"tp_mode": "2d"},
         "2.5D": {"tp_mode": "2.5d"}, "3D": {"tp_mode": "3d"}}
LAYOUTS = {  # title -> (model, topology, parallel kwargs)
    "Llama-3 8B, tp 4, pp 2, micro-batch 2, M 4 on one dgx-h100": (
        "llama3-8b", "dgx-h100",
        dict(tp=4, pp=2, num_microbatches=4, micro_batch_size=2)),
    "Llama-3 70B, tp 4, pp 8, micro-batch 2, M 8 on dgx-h100-x16-ndr": (
        "llama3-70b", "dgx-h100-x16-ndr",
        dict(tp=4, pp=8, num_microbatches=8, micro_batch_size=2)),
    "GPT-3 1.3B (vocabulary padded to 50304, as Megatron pads it), tp 16 (two nodes), pp 1, "
    "micro-batch 4, M 4 on dgx-h100-x16-ndr": (
        "gpt3-1.3b", "dgx-h100-x16-ndr",
        dict(tp=16, pp=1, num_microbatches=4, micro_batch_size=4)),
    "GPT-3 175B, tp 16 (two nodes), pp 8, micro-batch 4, M 8 on dgx-h100-x16-ndr": (
        "gpt3-175b", "dgx-h100-x16-ndr",
        dict(tp=16, pp=8, num_microbatches=8, micro_batch_size=4)),
    "Llama-3 8B, tp 8, pp 2, micro-batch 4, M 4 on dgx-h100-x16-ndr": (
        "llama3-8b", "dgx-h100-x16-ndr",
        dict(tp=8, pp=2, num_microbatches=4, micro_batch_size=4)),
    "GPT-3 175B, tp 64 (eight nodes), pp 2, micro-batch 16, M 4 on dgx-h100-x16-ndr": (
        "gpt3-175b", "dgx-h100-x16-ndr",
        dict(tp=64, pp=2, num_microbatches=4, micro_batch_size=16)),
}


def depth(tp: int) -> int:
    """2.5D's d: the smallest d >= 2 with tp / d a square of q >= 2 (else 2, refused)."""
    return next((d for d in range(2, tp // 4 + 1)
                 if tp % d == 0 and math.isqrt(tp // d) ** 2 == tp // d), 2)


def forward_elements(model, mode: str, tp: int) -> float:
    """Elements one rank moves in one layer's forward (module docstring)."""
    tokens = model.micro_batch_size * model.seq_length
    if mode in ("2D", "2.5D"):
        d = depth(tp) if mode == "2.5D" else 1
        q = math.isqrt(tp // d)
        return sum(tokens / d * h_in + h_in * h_out for h_in, h_out in layer_linears(model)) / q
    if mode == "3D":
        q = round(tp ** (1 / 3))
        return (q - 1) / q ** 3 * sum(tokens * (h_in + h_out) + h_in * h_out
                                      for h_in, h_out in layer_linears(model))
    return 4 * (tp - 1) / tp * tokens * model.hidden_size


def run_one(title: str, mode: str) -> dict:
    name, topology, kw = LAYOUTS[title]
    model = replace(get_model(name), micro_batch_size=kw["micro_batch_size"])
    if "padded to 50304" in title:
        model = replace(model, vocab_size=50304)
    row = {"mode": mode}
    started = time.perf_counter()
    try:
        grid = dict(MODES[mode], **({"tp_depth": depth(kw["tp"])} if mode == "2.5D" else {}))
        timeline = simulate(model, ParallelConfig.from_kwargs(**kw, **grid),
                            load_topology(topology))
    except ConfigError as refused:
        row["refused"] = str(refused)
        return row
    breakdown = timeline.time_breakdown()
    row.update({
        "sim_wall_s": time.perf_counter() - started,
        "iteration_time_s": timeline.iteration_time,
        "tp_exposed_s": sum(r["tp"] for r in breakdown.values()) / len(breakdown),
        "peak_memory_GB": max(timeline.peak_memory().values()) / 1e9,
        "forward_elements_per_layer": forward_elements(model, mode, kw["tp"]),
    })
    return row


def measure(work) -> dict:
    return {"layouts": {title: [run_one(title, mode) for mode in MODES]
                        for title in LAYOUTS}}


def markdown(data: dict) -> str:
    env = data["environment"]
    lines = ["# 1D against 2D, 2.5D and 3D tensor parallelism", "",
             f"`python benchmarks/tp_modes.py`: {__doc__.split(chr(10) + chr(10))[1]}", ""]
    for title, rows in data["layouts"].items():
        lines += [f"## {title}", "",
                  "| mode | iteration s | exposed TP s (mean rank) | peak memory GB (max rank) "
                  "| forward elements per layer and rank (closed form) |",
                  "|---|---:|---:|---:|---:|"]
        for r in rows:
            if "refused" in r:
                lines.append(f"| {r['mode']} | refused: {r['refused']} | | | |")
                continue
            lines.append(f"| {r['mode']} | {r['iteration_time_s']:.3f} | "
                         f"{r['tp_exposed_s']:.3f} | {r['peak_memory_GB']:.1f} | "
                         f"{r['forward_elements_per_layer'] / 1e6:.1f} M |")
        ran = {r["mode"]: r for r in rows if "refused" not in r}
        for mode in ("2D", "2.5D", "3D"):
            if {"1D + SP", mode} <= set(ran):
                sp, grid = ran["1D + SP"], ran[mode]
                ratio = {key: grid[key] / sp[key] for key in (
                    "iteration_time_s", "tp_exposed_s", "forward_elements_per_layer")}
                lines.append(f"\n{mode} against 1D + SP: {ratio['iteration_time_s']:.2f}x the "
                             f"iteration time, {ratio['tp_exposed_s']:.2f}x the exposed TP "
                             f"time, {ratio['forward_elements_per_layer']:.2f}x the forward "
                             f"elements per layer.")
        lines.append("")
    lines += ["## Environment", ""] + [f"- {k}: {v}" for k, v in env.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the .json")
    args = parser.parse_args()
    data = measured_or_saved(RESULTS / f"{NAME}.json", args.render, measure, environment)
    (RESULTS / f"{NAME}.md").write_text(markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()
