"""Does a GEMM's speed on the GPU depend on how it is called? The layer's GEMMs ran faster
under torch.profiler (F.linear and autograd's backward) than `clustersim calibrate`'s GEMM
table (torch.matmul(a, b, out=c)) measured the same shapes (benchmarks/results/layer_gpu.md).

For each GEMM shape (M, N, K) of Llama-3 8B's layer (tp 1, 8192 tokens) and 8192^3, times
one call of each way of computing the (M x N) product, and names the kernel cuBLAS chose:
- `matmul_out`: torch.matmul(a, b, out=c), a M x K and b K x N row-major (calibrate's way);
- `matmul`: a @ b;
- `linear`: F.linear(a, w), w N x K row-major (the layer's forward, x W^T);
- `t_matmul`: at.t() @ b, at K x M row-major (the weight gradient's X^T dY layout).
And the host time per launch of a tiny eager kernel (`launch`). First, how the speed of
F.linear depends on the operands' scale (`operand_scales`: a GPU at its power limit runs
slower on data that toggles more bits; the layer's weights are drawn with std 0.02).
Median of REPEATS CUDA-event timed calls after WARMUP, each on one of three operand sets in
rotation, random normal bf16. nvidia-smi samples SM clock, power and throttle reasons every
200 ms meanwhile (`smi.csv`).

    python benchmarks/gemm_layouts_gpu.py --out DIR     # on the GPU (about 1 min)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from clustersim.kernels.microbench import Timer, device_timed

SHAPES = ((8192, 4096, 4096), (8192, 1024, 4096), (8192, 14336, 4096), (8192, 4096, 14336),
          (8192, 4096, 1024), (4096, 4096, 8192), (4096, 1024, 8192), (4096, 14336, 8192),
          (14336, 4096, 8192), (8192, 8192, 8192))
"""The layer's forward GEMMs (q/proj, k/v, gate/fc1, fc2), the input gradients' new
shapes, the weight gradients' (K, N, T), and 8192^3."""
SUSTAINED = 20
WARMUP, REPEATS = 5, 20
SCALES = ((1.0, 1.0), (1.0, 0.02), (0.02, 0.02), (0.0, 0.0))


def operands(way: str, m: int, n: int, k: int):
    randn = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    if way in ("matmul_out", "matmul"):
        a, b = randn(m, k), randn(k, n)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        return (lambda: torch.matmul(a, b, out=c)) if way == "matmul_out" else (lambda: a @ b)
    if way == "linear":
        a, w = randn(m, k), randn(n, k)
        return lambda: F.linear(a, w)
    at, b = randn(k, m), randn(k, n)
    return lambda: at.t() @ b


def _device_seconds(run, count: int) -> float:
    """Mean device seconds of `count` back-to-back run(i) (kernels.microbench.device_timed:
    queued behind a sleeping kernel, so the host's launches are not timed)."""
    return device_timed(Timer(torch.device("cuda")), count, run)[0]


def time_way(way: str, shape: tuple[int, int, int]) -> dict:
    """Device TFLOP/s of one way at one shape: `cold` one call after 50 ms idle (median of
    5), `single` one call (median of REPEATS), `sustained` the mean of SUSTAINED calls back
    to back; and the kernels cuBLAS ran."""
    calls = [operands(way, *shape) for _ in range(3)]
    for i in range(WARMUP):
        calls[i % 3]()
    cold = []
    for i in range(5):
        time.sleep(0.05)
        cold.append(_device_seconds(lambda _: calls[i % 3](), 1))
    single = [_device_seconds(lambda _: calls[i % 3](), 1) for i in range(REPEATS)]
    sustained = _device_seconds(lambda i: calls[i % 3](), SUSTAINED)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        calls[0]()
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA
                      and "Memset" not in e.name})
    flops = 2 * shape[0] * shape[1] * shape[2]
    return {"cold": flops / statistics.median(cold) / 1e12,
            "single": flops / statistics.median(single) / 1e12,
            "sustained": flops / sustained / 1e12, "kernels": kernels}


def operand_scales(shape: tuple[int, int, int]) -> dict:
    """TFLOP/s of F.linear at `shape` with operands drawn N(0, sa^2) and N(0, sw^2) for
    the pairs of SCALES: event-timed (median of REPEATS single calls) and as the kernel
    durations torch.profiler records over REPEATS back-to-back calls."""
    m, n, k = shape
    out = {}
    for sa, sw in SCALES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * sa
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * sw
        for _ in range(WARMUP):
            F.linear(a, w)
        times = []
        for _ in range(REPEATS):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            F.linear(a, w)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(REPEATS):
                F.linear(a, w)
            torch.cuda.synchronize()
        kernel = sum(e.time_range.elapsed_us() for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA
                     and "Memset" not in e.name) / REPEATS / 1e6
        flops = 2 * m * n * k
        out[f"{sa} x {sw}"] = {"event_tflops": flops / statistics.median(times) / 1e12,
                               "kernel_tflops": flops / kernel / 1e12}
        print(shape, sa, sw, out[f"{sa} x {sw}"], flush=True)
    return out


def launch_overhead(calls: int = 2000) -> dict:
    """Host seconds per launch of a tiny kernel (an in-place add on 1024 elements) queued
    without synchronizing, and device seconds per such kernel back to back."""
    x = torch.zeros(1024, device="cuda")
    for _ in range(100):
        x.add_(1.0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(calls):
        x.add_(1.0)
    host = (time.perf_counter() - t0) / calls
    end.record()
    end.synchronize()
    return {"host_s_per_launch": host, "device_s_per_kernel": start.elapsed_time(end) / 1e3 / calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scales-only", action="store_true",
                        help="only the operand-scale comparison (operand_scales)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,"
                            "clocks_throttle_reasons.active", "--format=csv", "-lms", "200"],
                           stdout=open(args.out / "smi.csv", "w"), stderr=subprocess.STDOUT)
    results = {}
    try:
        for shape in (SHAPES[0], SHAPES[2]):
            results[f"{shape} scales"] = operand_scales(shape)
        for shape in () if args.scales_only else SHAPES:
            for way in ("matmul_out", "matmul", "linear", "t_matmul"):
                results[f"{shape} {way}"] = r = time_way(way, shape)
                print(f"{str(shape):20s} {way:10s} cold {r['cold']:4.0f} single "
                      f"{r['single']:4.0f} sustained {r['sustained']:4.0f} TFLOP/s  "
                      f"{r['kernels'][0][:48]}", flush=True)
        if not args.scales_only:
            results["launch"] = launch_overhead()
            print(results["launch"], flush=True)
    finally:
        smi.terminate()
        (args.out / "gemm_layouts.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
