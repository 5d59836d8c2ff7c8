"""One transformer layer on a GPU: the simulator's compute model against what the GPU did.

Reads what benchmarks/layer_gpu_measure.py measured on a GPU (RESULTS/layer_gpu.json and
the calibration profile RESULTS/profile_h100.json) and compares, for Llama-3 8B's layer
(hidden 4096, GQA 32/8, SwiGLU 14336, sequence 8192, micro-batch 1, bf16, tp 1):
1. the whole layer's forward and backward (the profile's F and B: `clustersim calibrate`,
   4 calls back to back) against the layer's kernels priced by sim.cost.RooflineCost on
   the device preset in three ways: the default model (Transformer Engine's fused
   kernels), the kernel list of eager PyTorch ops (`--no-fused-elementwise`, as the kernels
   backend runs it), and that list with the calibrated GEMM and attention tables
   (`--gemm-table`: the issue-16 must-show, target within 5%);
2. the same split by kernel class (GEMM, flash attention, other) against the CUDA kernel
   times torch.profiler recorded, and the calibrated time less the kernels';
3. the GEMM table against the shape law at the device's ceiling
   (sim.cost.gemm_seconds_at_ceiling, no attainment factor: one GEMM alone);
4. torch's SDPA backends against the published attention curves
   (topologies.attention_kernels), and the measured matmul and copy ceilings against the
   preset's.

    python benchmarks/layer_gpu.py            # renders RESULTS/layer_gpu.md
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from clustersim.schedules.layer_kernels import Kernel, layer_backward, layer_forward
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.profile import Profile
from clustersim.sim.attention_table import attention_seconds_of
from clustersim.sim.cli.flags import add_model_flags, model_from_args
from clustersim.sim.cost import RooflineCost, gemm_seconds_at_ceiling
from clustersim.sim.gemm_table import gemm_seconds_of
from clustersim.topologies.attention_kernels import attention_curve
from clustersim.topologies.devices import DEVICES

from run_cli import ROOT

DEVICE = "h100-sxm"
TARGET_PCT = 5.0
CLASSES = ("GEMM", "attention", "other")
GEMM_KERNELS = ("nvjet", "gemm", "cutlass", "xmma")
ATTENTION_KERNELS = ("sdpa", "flash", "fmha", "cudnn")


def kernel_class(name: str) -> str:
    """GEMM, attention or other, by a CUDA kernel's name (cuBLAS nvjet/xmma/cutlass GEMMs;
    cuDNN and flash attention kernels)."""
    lower = name.lower()
    if any(tag in lower for tag in ATTENTION_KERNELS):
        return "attention"
    if any(tag in lower for tag in GEMM_KERNELS):
        return "GEMM"
    return "other"


def measured_classes(table: dict[str, list[float]], calls: int) -> dict[str, float]:
    """Seconds per call of each kernel class in a profiler table."""
    out = dict.fromkeys(CLASSES, 0.0)
    for name, (_count, micros) in table.items():
        out[kernel_class(name)] += micros / calls / 1e6
    return out


def predicted_classes(cost: RooflineCost, kernels) -> dict[str, float]:
    out = dict.fromkeys(CLASSES, 0.0)
    for k in kernels:
        cls = "GEMM" if k.gemm else "attention" if k.attention else "other"
        out[cls] += cost.kernels_time([k])
    return out


def model(flags: list[str], *extra: str):
    parser = argparse.ArgumentParser()
    add_model_flags(parser)
    return model_from_args(parser.parse_args([*flags, *extra]))


def settings(flags: list[str], profile: Profile) -> dict[str, tuple]:
    """{name: (model, RooflineCost)} of the compared cost settings (module docstring)."""
    device = DEVICES[DEVICE]
    fused, eager = model(flags), model(flags, "--no-fused-elementwise")
    return {
        "default (fused kernels)": (fused, RooflineCost(device, fused.dtype)),
        "eager kernels": (eager, RooflineCost(device, eager.dtype)),
        "eager kernels + --gemm-table": (eager, RooflineCost(
            device, eager.dtype, gemm_seconds=gemm_seconds_of(profile),
            attention_seconds=attention_seconds_of(profile))),
    }


def pct(predicted: float, measured: float) -> str:
    return f"{(predicted / measured - 1) * 100:+.1f}%"


def layer_section(data: dict, profile: Profile) -> tuple[list[str], float]:
    flags = data["model_flags"]
    layer = profile.compute["layer"]
    kernels = data["layer_kernels"]
    lines = ["## 1. One layer, forward and backward", "",
             "Measured: the profile's layer F and B (`clustersim calibrate --device cuda`, "
             "the mean of 4 calls queued back to back, median of 7). Predicted: the layer's "
             "kernels (schedules/layer_kernels.py) priced by sim.cost.RooflineCost on the "
             f"`{DEVICE}` preset.", "",
             "| cost setting | F predicted ms | F measured ms | F error | B predicted ms | "
             "B measured ms | B error |", "|---|---:|---:|---:|---:|---:|---:|"]
    worst = 0.0
    rows = {}
    for name, (spec, cost) in settings(flags, profile).items():
        parallel = ParallelConfig()
        f = predicted_classes(cost, layer_forward(spec, parallel))
        b = predicted_classes(cost, layer_backward(spec, parallel))
        rows[name] = (f, b)
        pf, pb = sum(f.values()), sum(b.values())
        lines.append(f"| {name} | {pf * 1e3:.2f} | {layer['F'] * 1e3:.2f} | "
                     f"{pct(pf, layer['F'])} | {pb * 1e3:.2f} | {layer['B'] * 1e3:.2f} | "
                     f"{pct(pb, layer['B'])} |")
        if "gemm-table" in name:
            worst = max(abs(pf / layer["F"] - 1), abs(pb / layer["B"] - 1)) * 100
    lines += ["", f"With the calibrated tables the largest error is {worst:.1f}% "
              f"(target {TARGET_PCT:g}%: {'met' if worst <= TARGET_PCT else 'NOT met'}).", "",
              "## 2. By kernel class", "",
              f"Measured: CUDA kernel times under torch.profiler, the mean of "
              f"{kernels['calls']} calls; 'calibrated less kernels' is the calibrated F or B "
              "less the sum of its kernels; the same layer queued behind a sleeping kernel (so no host wait) "
              f"took F {kernels['device_s']['F'] * 1e3:.2f} ms and B "
              f"{kernels['device_s']['B'] * 1e3:.2f} ms on the device, and the host queues "
              "it faster than that (section 8). Predicted ms per setting.", "",
              "| pass | class | measured ms | " + " | ".join(rows) + " |",
              "|---|---|---:|" + "---:|" * len(rows)]
    for phase, key, index in (("F", "forward", 0), ("B", "backward", 1)):
        measured = measured_classes(kernels[key], kernels["calls"])
        for cls in CLASSES:
            lines.append(f"| {phase} | {cls} | {measured[cls] * 1e3:.3f} | " + " | ".join(
                f"{r[index][cls] * 1e3:.3f} ({pct(r[index][cls], measured[cls])})"
                for r in rows.values()) + " |")
        rest = layer[phase] - sum(measured.values())
        lines.append(f"| {phase} | calibrated less kernels | {rest * 1e3:.3f} | " + " | ".join(
            "0 (not modelled)" for _ in rows) + " |")
    return lines + [""], worst


def gemm_section(profile: Profile) -> list[str]:
    device = DEVICES[DEVICE]
    ratios = []
    for m, n, k, seconds in profile.gemm.points:
        kernel = Kernel("gemm", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n),
                        gemm=(m, n, k))
        law = gemm_seconds_at_ceiling(device, "bf16", kernel, 2)
        ratios.append((law / seconds, (m, n, k), 2 * m * n * k / seconds / 1e12))
    ratios.sort()
    values = [r[0] for r in ratios]
    quart = statistics.quantiles(values, n=4)
    big = [r for r in ratios if 2 * r[1][0] * r[1][1] * r[1][2] >= 1e11]
    return ["## 3. GEMM table against the shape law", "",
            f"{len(ratios)} shapes (`torch.matmul`, row-major operands, bf16) of the model's "
            "GEMMs at tp 1, 2, 4, 8 and a quarter to twice its tokens. Law = "
            "sim.cost.gemm_seconds_at_ceiling on the preset (its MAMF ceiling, no "
            "attainment factor). Ratio = law / measured (above 1: the law is slower).", "",
            f"- median ratio {statistics.median(values):.3f}, quartiles {quart[0]:.3f} .. "
            f"{quart[2]:.3f}, range {values[0]:.3f} ({ratios[0][1]}) .. {values[-1]:.3f} "
            f"({ratios[-1][1]})",
            f"- shapes of at least 100 GFLOP ({len(big)}): median ratio "
            f"{statistics.median(r[0] for r in big):.3f}, measured "
            f"{min(r[2] for r in big):.0f} .. {max(r[2] for r in big):.0f} TFLOP/s", ""]


def sdpa_section(data: dict) -> list[str]:
    device = DEVICES[DEVICE]
    lines = ["## 4. Attention backends against the published curves", "",
             "Causal SDPA, batch 1, 32 heads, head dim 128, bf16; TFLOP/s with the causal "
             "convention (forward 2 b h s^2 d, backward 2.5 x that; FlashAttention's "
             "benchmarks). Published: topologies/attention_kernels.py at that length.", "",
             "| torch backend | seq | fwd TFLOP/s | published fwd | bwd TFLOP/s | published bwd |",
             "|---|---:|---:|---:|---:|---:|"]
    published = {"flash": attention_curve(DEVICE, "flash"),
                 "cudnn": attention_curve(DEVICE, "fused"), "efficient": None}
    for backend, points in data["sdpa"].items():
        curve = published.get(backend)
        for seq, t in points.items():
            if "error" in t:
                lines.append(f"| {backend} | {seq} | {t['error']} | | | |")
                continue
            work = 2 * 32 * int(seq) ** 2 * 128
            fwd, bwd = work / t["forward"] / 1e12, 2.5 * work / t["backward"] / 1e12
            pub = ("-", "-") if curve is None else tuple(
                f"{curve.fraction(int(seq), phase) * device.peak('bf16') / 1e12:.0f}"
                for phase in ("forward", "backward"))
            lines.append(f"| {backend} | {seq} | {fwd:.0f} | {pub[0]} | {bwd:.0f} | {pub[1]} |")
    return lines + [""]


def ceiling_section(data: dict) -> list[str]:
    device, c = DEVICES[DEVICE], data["ceilings"]
    return ["## 5. Ceilings", "",
            f"- bf16 matmul {c['matmul_n']}^3 (three random operand sets in rotation): "
            f"{c['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s = "
            f"{c['matmul_flops_per_s'] / device.peak('bf16'):.3f} of the "
            f"{device.peak('bf16') / 1e12:.0f} "
            f"TFLOP/s peak (preset's ceiling: {device.matmul_ceiling_of('bf16'):.3f}, "
            f"{device.matmul_ceiling_source}; a maximum over many shapes)",
            f"- device-to-device copy of {c['copy_bytes'] / 2**30:.0f} GiB: "
            f"{c['copy_bytes_per_s'] / 1e12:.3f} TB/s read + written = "
            f"{c['copy_bytes_per_s'] / device.hbm_bandwidth:.3f} of the "
            f"{device.hbm_bandwidth / 1e12:.2f} TB/s datasheet (preset's ceiling: "
            f"{device.hbm_ceiling:.3f}, {device.hbm_ceiling_source})", ""]


def findings() -> list[str]:
    return ["## What this shows", "",
            "- **Kernels in a short burst run at the preset's ceilings.** The layer's GEMMs "
            "ran at the H100's MAMF ceiling (section 2), a bf16 8192^3 matmul at 0.80 of "
            "peak (section 5, the preset's 0.803), and the GEMM shape law "
            "(sim.cost.gemm_seconds_at_ceiling, built from published numbers only) is within "
            "a few percent of 196 measured shapes at the median (section 3).",
            "- **Under sustained load the GPU sits at its 700 W power cap** and its clock "
            "drops from 1980 MHz to about 1400-1800 (section 7); the same GEMMs then run "
            "15-20% slower. That is the size of the default model's attainment factor "
            "(0.8729, derived from an A100 layer measurement): ceiling x attainment = 0.701 "
            "of the H100's peak, 693 TFLOP/s, near the about 670 the calibrated table's large "
            "GEMMs ran at under calibration's sustained load (section 7). Hence the default "
            "model's GEMMs "
            "read about 20% slow against the burst-timed layer (section 2) while matching a "
            "GPU at its power cap, which is how a training run keeps it.",
            "- **The calibrated path** (`--gemm-table`, section 1) composes the layer from "
            "the table and the measured attention; its GEMMs were measured under the power "
            "cap and the layer's F and B partly before it, so it reads slow on GEMMs, and "
            "the roofline's eager kernel list (torchtitan's op-by-op RMSNorm and complex "
            "RoPE) prices more elementwise work than the kernels backend runs (one fused "
            "F.rms_norm, bf16 rotate-half RoPE). These errors partly cancel. The "
            "calibrated F and B exceed the layer's kernels back to back (section 2) "
            "though the host queues the layer in less than half the device's time and "
            "nothing synchronizes (section 8): consistent with calibration's sustained "
            "load at the power cap, not with host overhead.",
            "- **Eager PyTorch's host cost** is about 12-35 µs per op on this machine's "
            "CPU (section 8): a layer whose kernels average less than that is host-bound. "
            "How much of that a framework pays (Megatron with Transformer Engine, CUDA "
            "graphs, torch.compile) is not measured here, so the model has no host term.",
            "- **torch 2.11's SDPA picks cuDNN attention on the H100**, not "
            "FlashAttention-2 (the profiled kernels, section 2); cuDNN 9.19 here is 10-16% "
            "faster at 8k-16k tokens than the FA3 paper's cuDNN curve the preset uses, and "
            "torch's FlashAttention-2 within 10% of the published FA2 curve at 8k-16k but "
            "far slower at 1-2k (section 4).", ""]


def host_section(host: dict) -> list[str]:
    layer, ops = host["layer"], host["ops_host_s_per_call"]
    syncs = layer["syncs_in_forward_and_backward"]
    return ["## 8. Host time", "",
            "`python benchmarks/host_time_gpu.py` (same kind of machine, "
            f"{host['environment']['date']}): host seconds to queue work while the GPU "
            "sleeps (it cannot make the host wait).", "",
            f"- one layer: forward {layer['forward_host_s'] * 1e3:.2f} ms, backward "
            f"{layer['backward_host_s'] * 1e3:.2f} ms; synchronizations in a forward and "
            f"backward: {len(syncs) or 'none'} (torch.cuda.set_sync_debug_mode)",
            "- per eager op with autograd recording, small tensors: " + ", ".join(
                f"{name} {seconds * 1e6:.1f} µs" for name, seconds in ops.items()), ""]


def layouts_section(layouts: dict) -> list[str]:
    """How a GEMM's device time depends on how it is called and on the load before it
    (benchmarks/gemm_layouts_gpu.py)."""
    shapes = sorted({k.rsplit(" ", 1)[0] for k in layouts if k.endswith(("_out", "linear"))})
    lines = ["## 6. GEMMs by call layout and by load", "",
             "`python benchmarks/gemm_layouts_gpu.py` (same kind of machine: H100 80GB HBM3, "
             "torch 2.11.0+cu130, 2026-11-28): device TFLOP/s of each shape called four "
             "ways (torch.matmul with out=, a @ b, F.linear, a.t() @ b), each one call after "
             "50 ms idle (cold), one call (median of 20) and 20 calls back to back "
             "(sustained), all queued behind a sleeping kernel.", "",
             "| M, N, K | cold | single | sustained | spread over the 4 ways |",
             "|---|---:|---:|---:|---:|"]
    for shape in shapes:
        ways = [layouts[f"{shape} {w}"] for w in ("matmul_out", "matmul", "linear", "t_matmul")]
        singles = [w["single"] for w in ways]
        lines.append(f"| {shape} | {ways[0]['cold']:.0f} | {ways[0]['single']:.0f} | "
                     f"{ways[0]['sustained']:.0f} | {max(singles) / min(singles) - 1:.1%} |")
    launch = layouts["launch"]
    return lines + [
        "", "Cold, single and sustained are torch.matmul with out=, calibrate's call; 20 "
        "calls (tens of ms) are too short to reach the power cap (section 7). cuBLAS "
        "picks the same tile for every layout of a shape; the layout changes the time by "
        "about 1%.", "",
        f"Host time per launch of a tiny eager kernel: {launch['host_s_per_launch'] * 1e6:.1f} "
        f"µs (the device then spent {launch['device_s_per_kernel'] * 1e6:.1f} µs per kernel: "
        "host-bound).", ""]


def power_section(smi_csv: str, profile: Profile) -> list[str]:
    """SM clock and power while `clustersim calibrate` ran its measurements (nvidia-smi
    every 100 ms; samples above 200 W are the busy ones)."""
    busy = []
    for line in smi_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5 and float(parts[2].split()[0]) > 200:
            busy.append((int(parts[1].split()[0]), float(parts[2].split()[0]),
                         int(parts[4], 16) & 0x4 != 0))
    clocks = sorted(c for c, _, _ in busy)
    capped = sum(cap for _, _, cap in busy)
    return ["## 7. The power cap under sustained load", "",
            "nvidia-smi every 100 ms while `clustersim calibrate --device cuda --model "
            "llama3-8b --num-layers 8` ran on the same kind of machine "
            "([calibrate_smi_h100.csv](calibrate_smi_h100.csv)): of the "
            f"{len(busy)} samples drawing over 200 W, {capped} had the software power cap "
            "among the clock's throttle reasons; the SM clock was median "
            f"{statistics.median(clocks):.0f} MHz (from {clocks[0]} to {clocks[-1]}), "
            f"power up to {max(p for _, p, _ in busy):.0f} W against the 700 W limit; "
            "short bursts run at 1980 MHz. The GEMM table of profile_h100.json, measured "
            "the same way, has " + ", ".join(
                f"{shape} at {rate:.0f} TFLOP/s" for shape, rate in table_rates(
                    profile, LARGE_LAYER_GEMMS)) + "; one burst of each runs at about 810 "
            "(section 6).", ""]


LARGE_LAYER_GEMMS = ((8192, 14336, 4096), (14336, 4096, 8192))


def table_rates(profile: Profile, shapes) -> list[tuple[tuple, float]]:
    """TFLOP/s of measured shapes of the profile's GEMM table."""
    seconds = {tuple(p[:3]): p[3] for p in profile.gemm.points}
    return [(s, 2 * s[0] * s[1] * s[2] / seconds[s] / 1e12) for s in shapes]


def markdown(data: dict, profile: Profile) -> str:
    env = data["environment"]
    layer_lines, _ = layer_section(data, profile)
    return "\n".join([
        "# One layer on a GPU: the compute model against the kernels", "",
        f"Measured by `python benchmarks/layer_gpu_measure.py` on {env['gpu']} "
        f"({env['sm_count']} SMs; driver, power limit, max SM clock: {env['driver']}; torch "
        f"{env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}), {env['date']}; "
        f"calibration {data['calibrate_s']:.0f} s. Rendered by `python "
        "benchmarks/layer_gpu.py`. Model: `clustersim " + " ".join(data["model_flags"])
        + "` (one layer of it; the kernels backend's layer: eager PyTorch ops, torch's "
        "SDPA, which picked cuDNN attention here). The profile is "
        "[profile_h100.json](profile_h100.json): `clustersim simulate --gemm-table "
        "benchmarks/results/profile_h100.json` prices GEMMs and attention from it.", "",
        *findings(), *layer_lines, *gemm_section(profile), *sdpa_section(data),
        *ceiling_section(data), *layouts_section(data["layouts"]),
        *power_section(data["smi_csv"], profile), *host_section(data["host"]),
        "Environment:", "",
        *[f"- {k}: {v}" for k, v in env.items()], ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    data = json.loads((args.results / "layer_gpu.json").read_text())
    data["layouts"] = json.loads((args.results / "gemm_layouts_gpu.json").read_text())
    data["smi_csv"] = (args.results / "calibrate_smi_h100.csv").read_text()
    data["host"] = json.loads((args.results / "host_time_gpu.json").read_text())
    profile = Profile.load(args.results / "profile_h100.json")
    text = markdown(data, profile)
    (args.results / "layer_gpu.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
