"""Published speeds of fused (flash) attention kernels: the attention ceiling of a device.

A flash-attention kernel runs far below its device's matmul ceiling, and how far depends
on the implementation and the sequence length: on an H100 at 4k tokens, causal, head dim
128, FlashAttention-2's forward reaches 319 TFLOP/s and cuDNN's 518, where a GEMM reaches
794. `attention_fraction` gives the fraction of the device's dense bf16 peak that one
backend's causal forward or backward reaches at a sequence length, from the measurements
below (log-linear in the sequence length between points, held flat beyond the ends).

Convention of every source (FLOPs per call, b batch, s sequence, n heads, d head dim):
causal forward 2*b*s^2*n*d (half the score matrix), backward 2.5x the forward — the FLOP
count of flash-attention's benchmarks/benchmark_flash_attention.py and of cudnn-frontend's
benchmark_single_sdpa.py, and what schedules.layer_kernels charges as the kernel's work.

Backends, by Megatron-LM's --attention-backend spelling: 'fused' = cuDNN fused attention
(Transformer Engine's FusedAttention), 'flash' = FlashAttention-2 (the flash-attn package;
PyTorch's scaled_dot_product_attention flash backend vendors it). 'auto' is what
Megatron-Core with Transformer Engine picks (TE >= 1.2, attention backend selection:
"FusedAttention on sm90 and FlashAttention on others"; cuDNN first on sm100 too): fused on
Hopper and Blackwell, flash on Ampere.

Measurements (bf16/fp16, causal, head dim 128; TFLOP/s at s = 512, 1k, 2k, 4k, 8k, 16k):
- H100 SXM forward, flash and fused: Shah et al., "FlashAttention-3", arXiv 2407.08608,
  Figure 5(d) (b*s = 16k tokens, n*d = 2048), the FlashAttention-2 and cuDNN bars.
- H100 SXM flash backward: derived from the same figure's forward and the fwd+bwd bars of
  FlashAttention-2's H100 causal d128 benchmark (Dao 2023, arXiv 2307.08691, Figure 7;
  flash-attention README assets/flash2_h100_fwd_bwd_benchmark.png): a fwd+bwd rate C and a
  forward rate F give a backward rate B = 2.5 / (3.5/C - 1/F).
- H100 SXM fused backward: its forward times the backward/forward ratio cuDNN 9.19 reaches
  on an H200 (same SMs and clocks) at the same length (next item); 512 and 1k take the
  2k ratio (not measured).
- H200 fused: NVIDIA cudnn-frontend benchmark/sdpa_benchmark_training, results
  h200_919_only_cudnn/llama3.1_20260227_034703.csv (cuDNN 9.19.1; 64 query heads, 8 KV
  heads; 2k..32k).
- GB200 fused: same benchmark, results/llama3.1/gb200/llama3.1_20260424_100750.csv
  (cuDNN 9.22; 2k..32k). B200 is assumed to reach GB200's fraction of its own peak.
- A100 flash: FlashAttention-2's A100 causal d128 fwd+bwd benchmark (arXiv 2307.08691,
  Figure 4; README assets/flash2_a100_fwd_bwd_benchmark.png); forward and backward are
  not published apart there, so both take the fwd+bwd rate (assumed).
Devices with the same SMs take another's fractions, said in the curve's source: H100
PCIe/NVL and H200 flash as H100 SXM's, A100 40GB/PCIe as A100 SXM's. No measurement was
found for flash on Blackwell, fused on Ampere, or any attention kernel on MI300X: those
have no curve (the cost model says what it assumes instead).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

BACKENDS = ("auto", "fused", "flash")
"""--attention-backend values (Megatron-LM's spellings; module docstring)."""


@dataclass(frozen=True)
class AttentionCurve:
    """One backend's causal forward and backward TFLOP/s at sequence lengths `seq`, measured
    on a device whose dense bf16 peak is `peak_tflops`, with its source."""

    seq: tuple[int, ...]
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    peak_tflops: float
    source: str

    def fraction(self, seq_length: float, phase: str) -> float:
        """The fraction of the peak that `phase` ('forward' | 'backward') reaches at
        `seq_length` tokens: log-linear between measured lengths, flat beyond them."""
        rates = self.forward if phase == "forward" else self.backward
        x = math.log(max(seq_length, 1.0))
        xs = [math.log(s) for s in self.seq]
        i = bisect.bisect_left(xs, x)
        if i == 0:
            rate = rates[0]
        elif i == len(xs):
            rate = rates[-1]
        else:
            w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            rate = rates[i - 1] + w * (rates[i] - rates[i - 1])
        return rate / self.peak_tflops


def _backward_from_fwd_bwd(forward: tuple[float, ...], fwd_bwd: tuple[float, ...]
                           ) -> tuple[float, ...]:
    """Backward TFLOP/s from forward and fwd+bwd rates (backward = 2.5x forward FLOPs)."""
    return tuple(2.5 / (3.5 / c - 1 / f) for f, c in zip(forward, fwd_bwd))


_SEQ6 = (512, 1024, 2048, 4096, 8192, 16384)
_SEQ5 = (2048, 4096, 8192, 16384, 32768)
_H100_PEAK, _A100_PEAK, _GB200_PEAK = 989.4, 312.0, 2500.0

_H100_FLASH_FWD = (191.0, 260.0, 298.0, 319.0, 333.0, 335.0)
_H100_FLASH_FWD_BWD = (163.0, 221.0, 265.0, 294.0, 308.0, 328.0)
_H100_FUSED_FWD = (315.0, 410.0, 484.0, 518.0, 529.0, 539.0)
_H200_FUSED_FWD = (484.0, 591.0, 644.0, 673.0, 688.0)
_H200_FUSED_BWD = (370.0, 474.0, 541.0, 579.0, 581.0)
_H200_BWD_RATIO = tuple(b / f for f, b in zip(_H200_FUSED_FWD, _H200_FUSED_BWD))

H100_FLASH = AttentionCurve(
    _SEQ6, _H100_FLASH_FWD, _backward_from_fwd_bwd(_H100_FLASH_FWD, _H100_FLASH_FWD_BWD),
    _H100_PEAK, "FA3 paper Fig. 5(d) forward; backward from FA2 paper Fig. 7 fwd+bwd")
H100_FUSED = AttentionCurve(
    _SEQ6, _H100_FUSED_FWD,
    tuple(f * _H200_BWD_RATIO[max(0, i - 2)] for i, f in enumerate(_H100_FUSED_FWD)),
    _H100_PEAK, "FA3 paper Fig. 5(d) cuDNN forward; backward x cuDNN 9.19's H200 bwd/fwd")
H200_FUSED = AttentionCurve(_SEQ5, _H200_FUSED_FWD, _H200_FUSED_BWD, _H100_PEAK,
                            "cudnn-frontend sdpa benchmark, H200, cuDNN 9.19")
GB200_FUSED = AttentionCurve(
    _SEQ5, (1097.0, 1408.0, 1574.0, 1708.0, 1622.0), (885.0, 1148.0, 1332.0, 1328.0, 1226.0),
    _GB200_PEAK, "cudnn-frontend sdpa benchmark, GB200, cuDNN 9.22")
_A100_FLASH_FWD_BWD = (99.0, 133.0, 155.0, 173.0, 182.0, 189.0)
A100_FLASH = AttentionCurve(_SEQ6, _A100_FLASH_FWD_BWD, _A100_FLASH_FWD_BWD, _A100_PEAK,
                            "FA2 paper Fig. 4 fwd+bwd (forward and backward assumed equal)")


def _as(curve: AttentionCurve, device: str) -> AttentionCurve:
    return AttentionCurve(curve.seq, curve.forward, curve.backward, curve.peak_tflops,
                          f"assumed as {device}'s: {curve.source}")


ATTENTION_CURVES: dict[str, dict[str, AttentionCurve]] = {
    "h100-sxm": {"flash": H100_FLASH, "fused": H100_FUSED},
    "h100-pcie": {"flash": _as(H100_FLASH, "h100-sxm"), "fused": _as(H100_FUSED, "h100-sxm")},
    "h100-nvl": {"flash": _as(H100_FLASH, "h100-sxm"), "fused": _as(H100_FUSED, "h100-sxm")},
    "h200-sxm": {"flash": _as(H100_FLASH, "h100-sxm"), "fused": H200_FUSED},
    "b200": {"fused": _as(GB200_FUSED, "gb200")},
    "gb200": {"fused": GB200_FUSED},
    "a100-80gb-sxm": {"flash": A100_FLASH},
    "a100-80gb-pcie": {"flash": _as(A100_FLASH, "a100-80gb-sxm")},
    "a100-40gb-sxm": {"flash": _as(A100_FLASH, "a100-80gb-sxm")},
}
"""Device name (topologies.devices) -> backend -> its curve (module docstring)."""

AUTO_BACKEND = {"a100-80gb-sxm": "flash", "a100-80gb-pcie": "flash", "a100-40gb-sxm": "flash"}
"""'auto' per device where it is not 'fused' (Transformer Engine: flash on sm8x)."""


def resolve_backend(device: str, backend: str) -> str:
    """The backend 'auto' means on `device` (module docstring); others as given."""
    return AUTO_BACKEND.get(device, "fused") if backend == "auto" else backend


def attention_curve(device: str, backend: str) -> AttentionCurve | None:
    """The published curve of `backend` ('auto' resolved) on `device`, or None if none was
    found (module docstring)."""
    return ATTENTION_CURVES.get(device, {}).get(resolve_backend(device, backend))
