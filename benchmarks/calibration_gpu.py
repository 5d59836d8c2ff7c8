"""Calibrated simulator vs measured compute on one GPU.

The issue's GPU must-show: on a single GPU (one GPU cannot run NCCL between ranks),
1. `clustersim calibrate --device cuda`: the model's layer, embedding and head ops
   (F, B, I, W) at its shapes, medians after warm-up;
2. PP=1 with several microbatches run for real (`clustersim run --device cuda`) and
   simulated with that profile;
3. each pipeline rank's compute replayed on the one GPU (`clustersim run --replay`: every
   pipeline rank's program in turn, P2P in loopback) for PP=4 1F1B and PP=2 interleaved
   (vpp 2), and simulated with the same profile.
Predicted vs measured mean duration per (op kind, stage): target within 5%. A stage op's
prediction is composed from the per-layer profile (sim.profile_cost), so this checks that
the composition holds, not a fit. Measured spans are CUDA-event times in the executor.

Writes RESULTS/calibration_gpu.md and the raw numbers beside it (.json).

    python benchmarks/calibration_gpu.py               # about 3 minutes on an H100
    python benchmarks/calibration_gpu.py --out DIR     # results elsewhere
    python benchmarks/calibration_gpu.py --render      # the .md again from the .json
    python benchmarks/calibration_gpu.py --only PP=4 --out DIR   # some configurations
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from environment import environment
from run_cli import ROOT, clustersim, command, measured_or_saved

TARGET_PCT = 5.0
ITERATIONS, WARMUP = 5, 2
# Llama-3 8B's shapes (hidden 4096, GQA 32/8 heads, SwiGLU 14336, vocab 128256, sequence
# 8192, micro-batch 1, bf16) with 8 of its 32 layers, so that PP=1 holds the whole model,
# its gradients and a microbatch's activations on one 80 GB GPU.
MODEL = ("--model", "llama3-8b", "--num-layers", "8")
CONFIGS = {
    "PP=1 1F1B, 8 microbatches": ("--schedule", "1f1b", "--pp", "1", "--microbatches", "8"),
    "PP=4 1F1B replayed, 8 microbatches": ("--schedule", "1f1b", "--pp", "4",
                                           "--microbatches", "8", "--replay"),
    "PP=2 interleaved (vpp 2) replayed, 4 microbatches": (
        "--schedule", "interleaved-1f1b", "--pp", "2", "--vpp", "2", "--microbatches", "4",
        "--replay"),
}
COMPUTE = ("F", "B", "I", "W")


def gpu_environment() -> dict[str, str]:
    import torch
    env = environment()
    env["gpu"] = torch.cuda.get_device_name(0)
    env["torch"] = torch.__version__
    env["cuda"] = str(torch.version.cuda)
    try:
        env["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        env["driver"] = "unknown"
    return env


def measure(work: Path, configs: dict[str, tuple[str, ...]] = CONFIGS) -> dict:
    started = time.perf_counter()
    clustersim("calibrate", "--device", "cuda", *MODEL, "-o", "profile.json", cwd=work)
    data = {"calibrate_s": time.perf_counter() - started,
            "profile": json.loads((work / "profile.json").read_text()), "configs": {}}
    for name, flags in configs.items():
        sim_flags = tuple(f for f in flags if f != "--replay")
        clustersim("run", "--device", "cuda", *flags, *MODEL, "--iterations", str(ITERATIONS),
                   "--warmup-iterations", str(WARMUP), "--timeline-json", "measured.json",
                   "-o", "measured.html", cwd=work)
        clustersim("simulate", *sim_flags, *MODEL, "--profile", "profile.json",
                   "--timeline-json", "sim.json", "-o", "sim.html", cwd=work)
        compare = json.loads(clustersim("compare", "sim.json", "measured.json", "--json",
                                        cwd=work).stdout)
        measured = json.loads((work / "measured.json").read_text())
        data["configs"][name] = {
            "commands": [command("run", "--device", "cuda", *flags, *MODEL),
                         command("simulate", *sim_flags, *MODEL, "--profile", "profile.json")],
            "iteration_times": measured["meta"]["iteration_times"], "compare": compare}
        print(f"{name}: done", flush=True)
    return data


def _fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def markdown(data: dict) -> str:
    env, profile = data["environment"], data["profile"]
    layer = profile["compute"]["layer"]
    worst = 0.0
    lines = [
        "# Calibrated simulator vs measured compute on one GPU",
        "",
        f"`python benchmarks/calibration_gpu.py` on {env['gpu']} (torch {env['torch']}, "
        f"CUDA {env['cuda']}, driver {env['driver']}), {env['date']}. Model: Llama-3 8B "
        f"shapes with {MODEL[-1]} layers (bf16, sequence 8192, micro-batch 1). The profile "
        f"(`clustersim calibrate --device cuda`, {data['calibrate_s']:.0f} s) measured one "
        f"layer at F {_fmt_ms(layer['F'])} ms, B {_fmt_ms(layer['B'])} ms, I "
        f"{_fmt_ms(layer['I'])} ms, W {_fmt_ms(layer['W'])} ms. Each configuration: "
        f"{WARMUP} warm-up + {ITERATIONS} timed iterations, the median one kept; "
        "predicted = `clustersim simulate --profile`; error = (predicted - measured) / "
        f"measured of the mean span per (op kind, stage). Target: within {TARGET_PCT:g}%.",
        "",
    ]
    for name, cfg in data["configs"].items():
        cmp = cfg["compare"]
        lines += [f"## {name}", "", *[f"    {c}" for c in cfg["commands"]], "",
                  "| op | stage | count | measured ms | predicted ms | error |",
                  "|---|---:|---:|---:|---:|---:|"]
        for row in cmp["op_kinds_per_stage"]:
            if row["kind"] not in COMPUTE:
                continue
            worst = max(worst, abs(row["error_pct"]))
            lines.append(f"| {row['kind']} | {row['stage']} | {row['count_b']} | "
                         f"{_fmt_ms(row['mean_b_s'])} | {_fmt_ms(row['mean_a_s'])} | "
                         f"{row['error_pct']:+.2f}% |")
        times = ", ".join(f"{t:.4f}" for t in cfg["iteration_times"])
        note = ("" if "replayed" not in name else
                " (replayed ranks run alone, so this is the slowest rank's compute, not a "
                "pipeline's iteration)")
        lines += ["", f"Iteration: measured {cmp['b']['iteration_time_s']:.4f} s "
                      f"(timed iterations {times} s), predicted "
                      f"{cmp['a']['iteration_time_s']:.4f} s, error "
                      f"{cmp['iteration_time_error_pct']:+.2f}%{note}.", ""]
    verdict = "met" if worst <= TARGET_PCT else "NOT met"
    lines += [f"Largest per-op error: {worst:.2f}% (target {TARGET_PCT:g}%: {verdict}).", "",
              "Earlier runs, and the change to calibrate's timing between them: "
              "[calibration_gpu_runs.md](calibration_gpu_runs.md).", "",
              "Environment:", "", *[f"- {k}: {v}" for k, v in env.items()], ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the .json")
    parser.add_argument("--only", default="", metavar="TEXT",
                        help="run only the configurations whose name contains TEXT")
    args = parser.parse_args()
    configs = {name: flags for name, flags in CONFIGS.items() if args.only in name}
    if not configs:
        parser.error(f"--only {args.only!r} matches none of: {', '.join(CONFIGS)}")
    data = measured_or_saved(args.out / "calibration_gpu.json", args.render,
                             lambda work: measure(work, configs), gpu_environment)
    (args.out / "calibration_gpu.md").write_text(markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()
