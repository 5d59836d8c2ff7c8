"""How long the host takes to queue a layer's kernels in eager PyTorch: the other half of
an op's time when its kernels are short (benchmarks/results/layer_gpu.md found one layer's
calibrated forward 8% longer than its kernels back to back on the device).

With the GPU held busy by a sleeping kernel (so the host never waits for it), times on the
host clock how long queuing takes for
- one forward (autograd recording) and one backward of the kernels backend's layer at
  Llama-3 8B's shapes (kernels.microbench.stage_parts), median of REPEATS;
- single eager ops with autograd recording on small CUDA tensors (F.linear, an add, a
  multiply, F.rms_norm, F.silu, causal scaled_dot_product_attention): host seconds per
  call over CALLS calls;
and counts the host-device synchronizations a forward and backward make
(torch.cuda.set_sync_debug_mode 'warn').

    python benchmarks/host_time_gpu.py --out DIR     # on the GPU (about 20 s)
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from clustersim.kernels.microbench import stage_parts
from clustersim.schedules.model_presets import get_model
from environment import environment

REPEATS, CALLS = 5, 200
BUSY_CYCLES = 400_000_000  # about 0.2 s at H100 clocks: longer than anything queued behind it


def host_seconds(queue, busy: bool = True) -> float:
    """Host seconds of queue() while the GPU sleeps (it cannot make the host wait)."""
    torch.cuda.synchronize()
    if busy:
        torch.cuda._sleep(BUSY_CYCLES)
    t0 = time.perf_counter()
    queue()
    seconds = time.perf_counter() - t0
    torch.cuda.synchronize()
    return seconds


def layer_host_times() -> dict:
    spec = get_model("llama3-8b", num_layers=1)
    layer = stage_parts(spec, 0, torch.device("cuda"))["layer"]
    x = torch.randn(1, spec.seq_length, spec.hidden_size, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn_like(x) * 1e-3
    forward = lambda: layer(x.clone().requires_grad_(), None)  # noqa: E731
    for _ in range(3):
        torch.autograd.backward(forward(), grad)
    f, b = [], []
    for _ in range(REPEATS):
        out = []
        f.append(host_seconds(lambda: out.append(forward())))
        b.append(host_seconds(lambda: torch.autograd.backward(out[0], grad)))
    syncs = []
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.autograd.backward(forward(), grad)
        torch.cuda.set_sync_debug_mode("default")
        syncs = [str(w.message).splitlines()[0][:160] for w in caught]
    return {"forward_host_s": statistics.median(f), "backward_host_s": statistics.median(b),
            "syncs_in_forward_and_backward": syncs}


def op_host_times() -> dict:
    cuda, bf16 = "cuda", torch.bfloat16
    a = torch.randn(64, 256, device=cuda, dtype=bf16, requires_grad=True)
    w = torch.randn(256, 256, device=cuda, dtype=bf16, requires_grad=True)
    g = torch.ones(256, device=cuda, dtype=bf16, requires_grad=True)
    q = torch.randn(1, 4, 64, 64, device=cuda, dtype=bf16, requires_grad=True)
    ops = {"F.linear": lambda: F.linear(a, w), "add": lambda: a + a, "mul": lambda: a * a,
           "F.rms_norm": lambda: F.rms_norm(a, (256,), g, 1e-5), "F.silu": lambda: F.silu(a),
           "sdpa": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)}
    out = {}
    for name, op in ops.items():
        for _ in range(10):
            op()
        out[name] = host_seconds(lambda: [op() for _ in range(CALLS)]) / CALLS
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data = {"environment": {**environment(), "gpu": torch.cuda.get_device_name(0),
                            "torch": torch.__version__},
            "layer": layer_host_times(), "ops_host_s_per_call": op_host_times()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_time_gpu.json").write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps({k: data[k] for k in ("layer", "ops_host_s_per_call")}, indent=1))


if __name__ == "__main__":
    main()
