"""Measure one transformer layer on a GPU, kernel by kernel (the raw half of
benchmarks/layer_gpu.py, which renders and compares; run this one where the GPU is).

What it measures, each into one JSON:
1. `clustersim calibrate --device DEVICE` of the model: the profile with the layer's F/B/I/W,
   the GEMM table and the attention kernel (kernels.microbench), kept beside the JSON;
2. every kernel of one layer's forward and of its backward under torch.profiler (the
   kernels backend's layer, kernels.microbench.stage_parts, at the model's shapes): name,
   count and total device microseconds, averaged over PROFILED_CALLS calls after warm-up;
   and the layer's forward and backward device time with the host's launches queued ahead;
3. causal scaled_dot_product_attention (b=1, 32 heads, head dim 128) forward and backward
   at sequence lengths SDPA_SEQ on each of torch's flash (FlashAttention-2), cuDNN and
   memory-efficient backends: medians of CUDA-event times;
4. the device's two ceilings: a bf16 matrix product at 8192^3 (random operands, three
   operand sets in rotation) and a device-to-device copy of 1 GiB (bytes read + written).

    python benchmarks/layer_gpu_measure.py --out DIR            # on the GPU (about 2 min)
    python benchmarks/layer_gpu_measure.py --out DIR --device cpu --num-layers 1 \
        --hidden-size 256 --num-attention-heads 4 --seq-length 128 --ffn-hidden-size 512 \
        --vocab-size 1000    # the same path on the CPU, for a dry run
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from clustersim.kernels.microbench import Timer, device_timed
from environment import environment
from run_cli import clustersim

PROFILED_CALLS = 3
WARMUP_CALLS = 3
SDPA_SEQ = (1024, 2048, 4096, 8192, 16384)
SDPA_REPEATS = 10
MODEL_FLAGS = ("--model", "llama3-8b", "--num-layers", "8")
LAYER_QUEUE_CYCLES = 40_000_000  # about 20 ms at H100 clocks: longer than queuing a layer


def device_environment(device: torch.device) -> dict[str, str]:
    env = environment()
    env["torch"] = torch.__version__
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=str(props.multi_processor_count),
                   cuda=str(torch.version.cuda), cudnn=str(torch.backends.cudnn.version()))
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,power.limit,clocks.max.sm",
                 "--format=csv,noheader"], capture_output=True, text=True,
                check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            env["driver"] = "unknown"
    return env


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _kernel_events(prof, device: torch.device) -> dict[str, list[float]]:
    """{kernel name: [count, total microseconds]} of the device kernels a profile saw
    (on the CPU, of the aten ops with no parent: a dry run's stand-in)."""
    table: dict[str, list[float]] = {}
    for e in prof.events():
        if device.type == "cuda":
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            micros = e.time_range.elapsed_us()
        else:
            if e.cpu_parent is not None:
                continue
            micros = e.cpu_time_total
        row = table.setdefault(e.name, [0, 0.0])
        row[0] += 1
        row[1] += micros
    return table


def profile_layer(model_flags: list[str], device: torch.device) -> dict:
    """Kernel tables of one layer's forward and backward (module docstring, item 2), and
    the event-timed mean of each over PROFILED_CALLS back-to-back calls."""
    from torch.profiler import ProfilerActivity, profile

    from clustersim.kernels.layers import torch_dtype
    from clustersim.kernels.microbench import stage_parts
    from clustersim.sim.cli.flags import add_model_flags, model_from_args
    parser = argparse.ArgumentParser()
    add_model_flags(parser)
    spec = model_from_args(parser.parse_args(model_flags))
    layer = stage_parts(spec, 0, device)["layer"]
    b, s, h = spec.micro_batch_size, spec.seq_length, spec.hidden_size
    dtype = torch_dtype(spec)
    x = torch.randn(b, s, h, device=device, dtype=dtype)
    grad = torch.randn(b, s, h, device=device, dtype=dtype) * 1e-3

    def forwards(n: int) -> list[torch.Tensor]:
        return [layer(x.clone().requires_grad_(), None) for _ in range(n)]

    for out in forwards(WARMUP_CALLS):
        torch.autograd.backward(out, grad)
    sync(device)
    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    result = {}
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        outs = forwards(PROFILED_CALLS)
        sync(device)
    result["forward_wall_s"] = (time.perf_counter() - t0) / PROFILED_CALLS
    result["forward"] = _kernel_events(prof, device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for out in outs:
            torch.autograd.backward(out, grad)
        sync(device)
    result["backward_wall_s"] = (time.perf_counter() - t0) / PROFILED_CALLS
    result["backward"] = _kernel_events(prof, device)
    result["calls"] = PROFILED_CALLS
    if device.type == "cuda":
        result["device_s"] = device_layer_times(forwards, grad)
    return result


def device_layer_times(forwards, grad) -> dict[str, float]:
    """Median device seconds of one layer forward and backward queued behind a sleeping
    kernel long enough (LAYER_QUEUE_CYCLES) for the host to queue all of it first: the
    kernels and the device's own gaps, without waiting on the host."""
    timer = Timer(torch.device("cuda"))
    times: dict[str, list[float]] = {"F": [], "B": []}
    for _ in range(5):
        times["F"].append(device_timed(timer, 1, lambda _: forwards(1), LAYER_QUEUE_CYCLES)[0])
        outs = forwards(1)
        times["B"].append(device_timed(timer, 1, lambda _: torch.autograd.backward(outs[0], grad),
                                       LAYER_QUEUE_CYCLES)[0])
    return {k: statistics.median(v) for k, v in times.items()}


def _median_seconds(call, device: torch.device, repeats: int) -> float:
    """Median seconds of `call()`: on a GPU its device time, on a CPU the host clock
    (kernels.microbench.device_timed)."""
    timer = Timer(device)
    return statistics.median(device_timed(timer, 1, lambda _: call())[0]
                             for _ in range(repeats))


def sdpa_backends(device: torch.device, seqs: tuple[int, ...], heads: int, head_dim: int
                  ) -> dict[str, dict[int, dict[str, float]]]:
    """{backend: {seq: {'forward': s, 'backward': s}}} of causal SDPA on each backend torch
    has here (an unsupported one is recorded as its error)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa = torch.nn.functional.scaled_dot_product_attention
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    if device.type == "cuda":
        del backends["math"]
    results: dict = {}
    for name, backend in backends.items():
        results[name] = {}
        for seq in seqs:
            q, k, v = (torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype,
                                   requires_grad=True) for _ in range(3))
            dout = torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype)
            try:
                with sdpa_kernel(backend):
                    out = sdpa(q, k, v, is_causal=True)
                    torch.autograd.backward(out, dout)
                    forward = _median_seconds(lambda: sdpa(q, k, v, is_causal=True), device,
                                              SDPA_REPEATS)
                    outs = [sdpa(q, k, v, is_causal=True) for _ in range(SDPA_REPEATS)]
                    it = iter(outs)
                    backward = _median_seconds(
                        lambda: torch.autograd.backward(next(it), dout), device, SDPA_REPEATS)
                results[name][seq] = {"forward": forward, "backward": backward}
            except RuntimeError as error:
                results[name][seq] = {"error": str(error).splitlines()[0][:200]}
            q = k = v = dout = out = outs = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return results


def ceilings(device: torch.device, n: int, copy_bytes: int) -> dict[str, float]:
    """Achieved bf16 matmul FLOP/s at n^3 (three random operand sets in rotation) and
    device-to-device copy bytes/s (read + written) of `copy_bytes`."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sets = [(torch.randn(n, n, device=device, dtype=dtype),
             torch.randn(n, n, device=device, dtype=dtype)) for _ in range(3)]
    out = torch.empty(n, n, device=device, dtype=dtype)
    counter = iter(range(10**9))

    def matmul() -> None:
        a, b = sets[next(counter) % 3]
        torch.matmul(a, b, out=out)

    for _ in range(5):
        matmul()
    matmul_s = _median_seconds(matmul, device, 20)
    sets = out = None
    src = torch.randn(copy_bytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy_s = _median_seconds(lambda: dst.copy_(src), device, 20)
    return {"matmul_n": n, "matmul_flops_per_s": 2 * n**3 / matmul_s,
            "copy_bytes": copy_bytes, "copy_bytes_per_s": 2 * copy_bytes / copy_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--skip-calibrate", action="store_true")
    args, model_overrides = parser.parse_known_args()
    model_flags = [*MODEL_FLAGS, *model_overrides]
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    data: dict = {"model_flags": model_flags, "environment": device_environment(device)}
    small = args.device == "cpu"
    if not args.skip_calibrate:
        t0 = time.perf_counter()
        run = clustersim("calibrate", "--device", args.device, *model_flags,
                         *(("--repeats", "2", "--warmup", "1") if small else ()),
                         "-o", str(args.out.resolve() / "profile.json"), cwd=args.out)
        data["calibrate_s"] = time.perf_counter() - t0
        data["calibrate_stdout"] = run.stdout[-4000:]
        print(f"calibrate: {data['calibrate_s']:.0f} s", flush=True)
    data["layer_kernels"] = profile_layer(model_flags, device)
    print("layer profiled", flush=True)
    data["sdpa"] = sdpa_backends(device, (64, 128) if small else SDPA_SEQ,
                                 2 if small else 32, 64 if small else 128)
    print("sdpa done", flush=True)
    data["ceilings"] = ceilings(device, 512 if small else 8192, 2**20 if small else 2**30)
    (args.out / "layer_gpu.json").write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps({"ceilings": data["ceilings"],
                      "forward_wall_ms": data["layer_kernels"]["forward_wall_s"] * 1e3,
                      "backward_wall_ms": data["layer_kernels"]["backward_wall_s"] * 1e3}))


if __name__ == "__main__":
    sys.exit(main())
