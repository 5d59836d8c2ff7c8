"""GPU device datasheet specs: peak dense FLOP/s per dtype, HBM and scale-up link bandwidth,
and the best measured (achievable) fractions of those peaks.

Units: FLOP/s, bytes/s, bytes (1 GB = 1e9 bytes, as on the datasheets; memory: below), watts. All FLOP/s
are *dense* tensor-core (matrix-core) peaks: the datasheets' headline numbers with 2:4
sparsity are 2x these, and are halved here. The 'fp32' key is TF32 dense tensor-core
throughput, which is what fp32 matmuls use under PyTorch's `allow_tf32`; plain FP32 CUDA-core
peaks are much lower. 'fp4' is Blackwell's FP4 tensor-core rate. `nvlink_bandwidth` is per
GPU, aggregate over its scale-up links (NVLink; Infinity Fabric on the MI300X), per
direction: datasheets quote the bidirectional total, i.e. 2x.

Datasheet sources (sparse quotes halved, bidirectional quotes halved):
- NVIDIA A100 Tensor Core GPU datasheet: A100 80GB SXM: BF16/FP16 312 / TF32 156 TFLOPS
  dense, HBM2e 2,039 GB/s, 80 GB, NVLink 600 GB/s, 400 W; A100 80GB PCIe: 312 / 156,
  1,935 GB/s, 80 GB, 300 W (its optional 2-GPU NVLink bridge is not modelled: nvlink 0,
  which only devices whose name contains 'pcie' may have); A100 40GB SXM: 312 / 156,
  HBM2 1,555 GB/s, 40 GB, NVLink 600 GB/s, 400 W.
- NVIDIA H100 Tensor Core GPU datasheet (the SXM / PCIe / NVL table): FP8 3,958 / 3,026 /
  3,341, BF16 and FP16 1,979 / 1,513 / 1,671, TF32 989 / 756 / 835 TFLOPS with sparsity
  (SXM dense: 1,978.9 / 989.4 / 494.7, the H100 architecture whitepaper's figures);
  HBM 80 GB at 3.35 TB/s / 80 GB at 2 TB/s / 94 GB at 3.9 TB/s; NVLink 900 GB/s (SXM) and
  600 GB/s (PCIe and NVL: 2-GPU NVLink bridge); max TDP 700 / 350 / 400 W.
- NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): compute as H100 SXM, HBM3e 141 GB at
  4.8 TB/s, NVLink 900 GB/s, 700 W.
- B200 (one GPU of an HGX / DGX B200): NVIDIA HGX platform page, HGX B200 column (8 GPUs):
  FP4 144 PFLOPS, FP8 72, FP16/BF16 36, TF32 18 PFLOPS with sparsity; NVLink 5 1.8 TB/s
  GPU-to-GPU (14.4 TB/s for 8). NVIDIA DGX B200 datasheet: 1,440 GB of GPU memory and
  64 TB/s of HBM3e bandwidth for 8 GPUs (180 GB, 8 TB/s each). Max TGP 1,000 W (DGX B200
  user guide, power capping).
- GB200 (one Blackwell GPU of a GB200 superchip, 2 per superchip, 72 per NVL72 rack):
  NVIDIA GB200 NVL72 specifications (72 GPUs): FP4 1,440 PFLOPS, FP8/FP6 720, FP16/BF16
  360, TF32 180 PFLOPS with sparsity; superchip column: 372 GB HBM3e at 16 TB/s per 2 GPUs
  (186 GB, 8 TB/s each); NVLink 130 TB/s per rack = 1.8 TB/s per GPU. Power: 1,200 W per
  GPU as listed by ml-engineering (below; 'per-GPU maximum power').
- AMD Instinct MI300X datasheet / product page: peak FP16 and BF16 1,307.4, FP8 2,614.9,
  TF32 653.7 TFLOPS (AMD's dense figures; sparse is 2x), HBM3 192 GB at 5.3 TB/s, 304 CUs,
  750 W peak board power, 7 Infinity Fabric links at 'peak 128 GB/s' each. AMD does not say
  whether 128 GB/s is one or both directions; it is read as both (64 GB/s per direction),
  as ml-engineering's network chapter reads it (7 x 64 = 448 GB/s per direction, 896
  duplex) and as AMD's own per-link arithmetic for CDNA 2 reads (ROCm MI250
  microarchitecture: a 16-wide link at 25 GT/s is 50 GB/s, which AMD quotes as 100 GB/s).
- Compute capability (NVIDIA, "CUDA GPUs - Compute Capability"): A100 8.0, H100 and H200
  9.0, B200 and GB200 10.0; the MI300X has none (ROCm's gfx942).
- SMs: 108 on an A100 (NVIDIA A100 architecture whitepaper), 132 on an H100 SXM5 / H200 and
  114 on an H100 PCIe (NVIDIA H100 architecture whitepaper). No NVIDIA datasheet gives the
  H100 NVL's or the Blackwell GPUs' SM count: 132 (H100 NVL) and 148 (B200, GB200) are
  what the devices report (torch `multi_processor_count`, as quoted in public issue
  threads); 148 agrees with GB200's 2,500 TFLOPS dense BF16 = 148 SMs x 4 tensor cores x
  2,048 FLOP/clock x 2,062 MHz (the clock ml-engineering reports for it). The MI300X's
  `sm_count` holds its 304 compute units.

Memory (`memory_bytes`): the bytes CUDA reports as the device's total
(cudaMemGetInfo's total, torch.cuda's total_memory, which PyTorch's out-of-memory message
prints as "total capacity" and vLLM sizes its KV cache from), not the datasheet's decimal
GB: an "80 GB" H100 is 79.1-79.3 GiB to CUDA (85.0e9 B), 6% over 80e9. Published readings
(GiB = 2^30 B; they vary by a few hundredths with the driver, and the least is taken):
- H100 SXM 80GB: 79.11 GiB (vllm-project/vllm issue 27508: "GPU 0 has a total capacity
  of 79.11 GiB"; others print 79.18-79.33). H100 PCIe 80GB: assumed as the SXM's (same 80
  GB of HBM, no reading found).
- A100 80GB: 79.25 GiB (sgl-project/sglang issue 1463, an A800 80GB, the A100's memory;
  HiDream-ai/VAREdit issue 6, an A100 80GB), both SXM and PCIe. A100 40GB: 42,298,834,944
  B (deviceQuery on an A100-PCIE-40GB, bottlerocket-os/bottlerocket PR 3873; the SXM4's
  40 GB of HBM2 assumed the same).
- H200: 139.81 GiB (sungwon-chae/arxiv_confi, etu_logging.md: "NVIDIA H200 (139.8 GB)",
  "GPU 0 has a total capacity of 139.81 GiB").
- B200: 178.36 GiB (PrimeIntellect-ai/prime-rl benchmarks/results/BENCHMARKS.md, a run
  "on 8xB200": "total capacity of 178.36 GiB").
- MI300X: 191.98 GiB (ROCm/rocm-blogs, blogs/artificial-intelligence/gptq: "GPU 0 has a
  total capacity of 191.98 GiB").
- H100 NVL and GB200: no reading found: the datasheet's 94 GB and 186 GB (decimal), which
  `memory_source` says.
What a run holds besides the model's tensors (the CUDA context, NCCL's buffers, the
allocator's fragmentation) is not modelled: the simulated peak is what the tensors hold.

Achievable ceilings (`matmul_ceiling`, `hbm_ceiling`: fractions of the peaks above):
- Matmul: S. Bekman, "Machine Learning Engineering" (github.com/stas00/ml-engineering,
  compute/accelerator/README.md, commit 744d01e, 2026-08), "Maximum Achievable Matmul
  FLOPS comparison table" (v2: cache flushed between iterations; mean of 100 after 50
  warm-up), best shape found by mamf-finder.py. Rows used, MAMF TFLOPS (torch): A100 SXM
  bf16 271.2 (2.6.0+cu126); A100 PCIe bf16 252.9 (2.5.1+cu124); H100 SXM bf16 794.5, fp8
  1402.6 (2.7.0+cu126; the bf16 row notes "H200 is the same"); H200 SXM fp8 1453.4
  (2.7.1+cu128); B200 SXM bf16 1745.0, fp8 3432.5 (2.7.1+cu128); GB200 SXM bf16 1822.0,
  fp8 3615.6 (2.10.0.dev+cu130); MI300X bf16 668.4 (2.5.1+ROCm 6.3, tunable ops on). The
  fraction stored is MAMF / this module's peak (so peak x fraction = the MAMF).
  The older v1 table (no cache flush, CUDA 12.1) gave A100 SXM 267.9 (85.9%), the
  figure benchmarks/fidelity.py uses; v1 MI300X was 781.9 on ROCm 6.2.
  Not measured there, and so assumed (the source string says so): A100 40GB as the A100
  SXM row (same GA100 configuration and clocks); H100 PCIe and H100 NVL as the H100 SXM
  rows (same Hopper SMs, fewer or slower); MI300X fp8 (empty row) as its bf16 fraction.
- GEMM shapes (`matmul_best_shape`, `gemm_floor_s`): on Ampere and Hopper a GEMM writes
  each output tile after its K loop, so the output's HBM write adds to the K loop's time,
  and every GEMM kernel takes a floor of time (sim.cost, gemm_seconds_at_ceiling); the K
  loop's own rate follows from the MAMF and the shape it was found at (the table's best
  MxNxK: A100 SXM 1024x10240x5120, A100 PCIe 2048x5120x6144, H100 SXM bf16
  2048x2048x13312 and fp8 1024x9216x14336, H200 SXM fp8 1280x4096x12032; devices assumed
  as another take its shape). The floor, 5.36 us on Hopper, is the time of the smallest
  GEMM XLA measured on an H100 (256x512x256 bf16 at 12.5 TFLOP/s: openxla
  xla/service/gpu/model/matmul_interpolator_data.h, 'sm_90', commit f3253733); no A100
  measurement was found (floor 0). Blackwell's best shapes have a short K (B200
  1792x16128x3072, GB200 4096x9728x2048), at which an exposed output write would cost
  8-12%: its GEMMs overlap the write (two accumulators in tensor memory) and keep the flat
  ceiling, as the MI300X does for want of a measurement to check against.
- HBM: 1.80 of 2.04 TB/s (88%) read bandwidth measured on an A100 80GB SXM (NVIDIA developer
  forum, "Trouble to reach peak bandwidth of A100", which also cites ~90% as the best any
  kernel reached in a GTC talk), as in benchmarks/results/fidelity.md. H100 SXM: 3.01 of
  3.35 TB/s (0.899), a 1 GiB device-to-device copy (bytes read + written, CUDA events,
  median of 20) measured on an H100 80GB HBM3 at 700 W (benchmarks/results/layer_gpu.md,
  section 5). No comparable measurement was found for the other devices: their
  hbm_ceiling is the A100's 0.88, marked assumed in hbm_ceiling_source.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from .errors import TopologyError

# Framework spellings of a dtype -> the key used in DeviceSpec.peak_flops.
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "tf32": "fp32",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "fp4": "fp4", "float4": "fp4", "float4_e2m1fn_x2": "fp4",
}


def _fraction_ok(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 < x <= 1


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model's datasheet numbers and achievable ceilings (module docstring: units,
    sources). The fields after `sm_count` are optional, so older callers still build one."""

    name: str
    peak_flops: Mapping[str, float] = field(hash=False)  # dense FLOP/s per dtype key
    hbm_bandwidth: float  # bytes/s
    memory_bytes: float  # bytes CUDA reports as the total (module docstring, "Memory")
    nvlink_bandwidth: float  # bytes/s per direction, per GPU, all scale-up links together
    sm_count: int  # SMs (CUs on AMD): what communication kernels take from GEMMs
    # Best measured dense GEMM FLOP/s as a fraction of peak_flops[key], per dtype key.
    matmul_ceiling: Mapping[str, float] = field(default_factory=dict, hash=False)
    matmul_ceiling_source: str = ""  # short citation; says "assumed" for unmeasured parts
    hbm_ceiling: float | None = None  # best measured HBM bandwidth / hbm_bandwidth
    # (M, N, K) each matmul_ceiling was measured at, per dtype key, where GEMMs write their
    # output after the K loop (module docstring); empty: the flat ceiling
    matmul_best_shape: Mapping[str, tuple[int, int, int]] = field(default_factory=dict,
                                                                  hash=False)
    gemm_floor_s: float = 0.0  # the least time of a GEMM kernel, s (module docstring)
    compute_capability: tuple[int, int] | None = None  # CUDA's (major, minor); None: not CUDA
    hbm_ceiling_source: str = ""  # as matmul_ceiling_source
    tdp_watts: float | None = None  # maximum board power, W (None: not recorded)
    interconnect: str = "NVLink"  # what nvlink_bandwidth is: 'NVLink', 'Infinity Fabric'
    memory_source: str = "datasheet (decimal GB)"  # where memory_bytes comes from

    def __post_init__(self) -> None:
        # Read-only copies so the registry's shared instances cannot be mutated.
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))
        object.__setattr__(self, "matmul_ceiling", MappingProxyType(dict(self.matmul_ceiling)))
        object.__setattr__(self, "matmul_best_shape",
                           MappingProxyType(dict(self.matmul_best_shape)))
        where = f"device {self.name!r}"
        nvlink = self.nvlink_bandwidth
        if not isinstance(nvlink, (int, float)) or nvlink < 0 or (nvlink == 0 and "pcie" not in self.name):
            raise TopologyError(
                f"{where}: nvlink_bandwidth must be > 0 bytes/s (0 only for "
                f"PCIe devices, whose name contains 'pcie'), got {nvlink!r}")
        for key, value in self.matmul_ceiling.items():
            if key not in self.peak_flops:
                raise TopologyError(f"{where}: matmul_ceiling key {key!r} has no peak_flops entry; "
                                    f"keys: {', '.join(sorted(self.peak_flops))}")
            if not _fraction_ok(value):
                raise TopologyError(f"{where}: matmul_ceiling[{key!r}] must be a fraction in (0, 1], got {value!r}")
        for key, shape in self.matmul_best_shape.items():
            if key not in self.matmul_ceiling or self.hbm_ceiling is None or not (
                    isinstance(shape, tuple) and len(shape) == 3
                    and all(isinstance(x, int) and x >= 1 for x in shape)):
                raise TopologyError(f"{where}: matmul_best_shape[{key!r}] must be the (M, N, K) "
                                    f"of a measured matmul_ceiling (with an hbm_ceiling), got "
                                    f"{shape!r}")
        cc = self.compute_capability
        if cc is not None and not (isinstance(cc, tuple) and len(cc) == 2
                                   and all(isinstance(x, int) and x >= 0 for x in cc)):
            raise TopologyError(f"{where}: compute_capability must be (major, minor) integers "
                                f"or None, got {cc!r}")
        if not (isinstance(self.gemm_floor_s, (int, float)) and 0 <= self.gemm_floor_s < 1):
            raise TopologyError(f"{where}: gemm_floor_s must be seconds in [0, 1), got "
                                f"{self.gemm_floor_s!r}")
        if self.hbm_ceiling is not None and not _fraction_ok(self.hbm_ceiling):
            raise TopologyError(f"{where}: hbm_ceiling must be a fraction in (0, 1] or None, got {self.hbm_ceiling!r}")
        for ceiling, source in (("matmul_ceiling", "matmul_ceiling_source"),
                                ("hbm_ceiling", "hbm_ceiling_source")):
            if getattr(self, ceiling) and not getattr(self, source):
                raise TopologyError(f"{where}: {source} must name where {ceiling} comes from")
        tdp = self.tdp_watts
        if tdp is not None and not (isinstance(tdp, (int, float)) and math.isfinite(tdp) and tdp > 0):
            raise TopologyError(f"{where}: tdp_watts must be a positive number of watts or None, got {tdp!r}")

    def _key(self, dtype: str) -> str:
        key = _DTYPE_ALIASES.get(str(dtype).strip().lower())
        if key is None or key not in self.peak_flops:
            raise TopologyError(
                f"device {self.name!r} has no peak FLOP/s for dtype {dtype!r}; "
                f"it has: {', '.join(sorted(self.peak_flops))}"
            )
        return key

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype` ('bf16', 'bfloat16', 'fp32', 'tf32', ...)."""
        return self.peak_flops[self._key(dtype)]

    def matmul_ceiling_of(self, dtype: str) -> float | None:
        """The achievable fraction of `peak(dtype)` for a dense GEMM, or None if unknown.

        fp16 falls back to bf16's fraction (same tensor-core rate on every device here; an
        assumption, the benchmark measured bf16). An unknown dtype raises as `peak` does."""
        key = self._key(dtype)
        if key == "fp16" and key not in self.matmul_ceiling:
            key = "bf16"
        return self.matmul_ceiling.get(key)

    def best_shape_of(self, dtype: str) -> tuple[int, int, int] | None:
        """The (M, N, K) `dtype`'s matmul ceiling was measured at where GEMMs write their
        output after the K loop (module docstring), else None; fp16 as bf16."""
        key = self._key(dtype)
        if key == "fp16" and key not in self.matmul_best_shape:
            key = "bf16"
        return self.matmul_best_shape.get(key)

    def achievable_flops(self, dtype: str) -> float | None:
        """Best measured dense GEMM FLOP/s for `dtype` (peak x ceiling), or None if unknown."""
        fraction = self.matmul_ceiling_of(dtype)
        return None if fraction is None else self.peak(dtype) * fraction

    @property
    def achievable_hbm_bandwidth(self) -> float | None:
        """Best measured HBM bytes/s (hbm_bandwidth x hbm_ceiling), or None if unknown."""
        return None if self.hbm_ceiling is None else self.hbm_bandwidth * self.hbm_ceiling


# --- memory CUDA reports (module docstring, "Memory") --------------------------------------------
GIB = 2 ** 30
_H100_MEMORY = {"memory_bytes": 79.11 * GIB,
                "memory_source": "CUDA's total, 79.11 GiB (vllm issue 27508, H100 80GB)"}
_A100_80_MEMORY = {"memory_bytes": 79.25 * GIB,
                   "memory_source": "CUDA's total, 79.25 GiB (sglang issue 1463, A800 80GB)"}


# --- achievable ceilings (module docstring: sources) -------------------------------------------
MAMF_SOURCE = "ml-engineering MAMF v2"  # S. Bekman's table, commit 744d01e (module docstring)
HBM_A100_CEILING = 0.88  # 1.80 of 2.04 TB/s read on an A100 80GB SXM (NVIDIA developer forum)
HBM_A100_SOURCE = "A100 80GB SXM read 1.80/2.04 TB/s (NVIDIA forum)"
HBM_H100_SXM_CEILING = 0.899
HBM_H100_SXM_SOURCE = ("measured: 1 GiB device-to-device copy, 3.01 TB/s on an H100 80GB HBM3 "
                       "(benchmarks/results/layer_gpu.md)")
_HBM_ASSUMED = "assumed as a100-80gb-sxm's 1.80/2.04 TB/s (no published measurement found)"

# Peaks (dense FLOP/s) shared by several devices.
_A100 = {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12}
# H100 SXM: the whitepaper's dense figures (the datasheet's sparse 1,979 / 989 / 3,958 halved,
# unrounded).
_H100_SXM = {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 494.7e12, "fp8": 1978.9e12}
_H100_PCIE = {"bf16": 1513e12 / 2, "fp16": 1513e12 / 2, "fp32": 756e12 / 2, "fp8": 3026e12 / 2}
_H100_NVL = {"bf16": 1671e12 / 2, "fp16": 1671e12 / 2, "fp32": 835e12 / 2, "fp8": 3341e12 / 2}
# HGX B200 (8 GPUs) and GB200 NVL72 (72 GPUs) sparse PFLOPS -> dense per GPU.
_B200 = {k: v * 1e15 / 8 / 2 for k, v in
         {"bf16": 36, "fp16": 36, "fp32": 18, "fp8": 72, "fp4": 144}.items()}
_GB200 = {k: v * 1e15 / 72 / 2 for k, v in
          {"bf16": 360, "fp16": 360, "fp32": 180, "fp8": 720, "fp4": 1440}.items()}
_MI300X = {"bf16": 1307.4e12, "fp16": 1307.4e12, "fp32": 653.7e12, "fp8": 2614.9e12}


def _mamf(peaks: Mapping[str, float], **measured_tflops: float) -> dict[str, float]:
    """Fractions of `peaks` from measured TFLOPS per dtype key (MAMF / peak)."""
    return {key: tflops * 1e12 / peaks[key] for key, tflops in measured_tflops.items()}


_A100_MAMF = _mamf(_A100, bf16=271.2)
_H100_MAMF = _mamf(_H100_SXM, bf16=794.5, fp8=1402.6)
_A100_BEST = {"bf16": (1024, 10240, 5120)}  # the MAMF table's best shapes (docstring)
_H100_BEST = {"bf16": (2048, 2048, 13312), "fp8": (1024, 9216, 14336)}
_HOPPER_GEMM_FLOOR_S = 2 * 256 * 512 * 256 / 12.5e12  # XLA's H100 256x512x256 (docstring)
# The GEMM facts of the A100 SXM and H100 SXM rows, and of the devices assumed as them.
_A100_GEMMS = {"matmul_ceiling": _A100_MAMF, "matmul_best_shape": _A100_BEST}
_H100_GEMMS = {"matmul_ceiling": _H100_MAMF, "matmul_best_shape": _H100_BEST,
               "gemm_floor_s": _HOPPER_GEMM_FLOOR_S}
_AS_H100_SXM = {**_H100_GEMMS,
                "matmul_ceiling_source": f"assumed as h100-sxm: {MAMF_SOURCE}, H100 SXM"}
_MI300X_BF16 = _mamf(_MI300X, bf16=668.4)["bf16"]

DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        DeviceSpec(
            name="a100-80gb-sxm", compute_capability=(8, 0),
            peak_flops=_A100,
            hbm_bandwidth=2039e9, **_A100_80_MEMORY, nvlink_bandwidth=600e9 / 2, sm_count=108,
            **_A100_GEMMS, matmul_ceiling_source=f"{MAMF_SOURCE}, A100 SXM",
            hbm_ceiling=HBM_A100_CEILING, hbm_ceiling_source=HBM_A100_SOURCE, tdp_watts=400,
        ),
        DeviceSpec(
            name="a100-80gb-pcie", compute_capability=(8, 0),
            peak_flops=_A100,
            hbm_bandwidth=1935e9, **_A100_80_MEMORY, nvlink_bandwidth=0.0, sm_count=108,
            matmul_ceiling=_mamf(_A100, bf16=252.9), matmul_ceiling_source=f"{MAMF_SOURCE}, A100 PCIe",
            matmul_best_shape={"bf16": (2048, 5120, 6144)}, hbm_ceiling=HBM_A100_CEILING,
            hbm_ceiling_source="assumed as a100-80gb-sxm's (same HBM2e generation)", tdp_watts=300,
        ),
        DeviceSpec(
            name="a100-40gb-sxm", compute_capability=(8, 0),
            peak_flops=_A100,
            hbm_bandwidth=1555e9, memory_bytes=42_298_834_944, nvlink_bandwidth=600e9 / 2,
            sm_count=108, memory_source="CUDA's total (deviceQuery, A100-PCIE-40GB: "
                                        "bottlerocket PR 3873)",
            **_A100_GEMMS,
            matmul_ceiling_source=f"assumed as a100-80gb-sxm: {MAMF_SOURCE}, A100 SXM",
            hbm_ceiling=HBM_A100_CEILING,
            hbm_ceiling_source="assumed as a100-80gb-sxm's (no published measurement found)",
            tdp_watts=400,
        ),
        DeviceSpec(
            name="h100-sxm", compute_capability=(9, 0),
            peak_flops=_H100_SXM,
            hbm_bandwidth=3.35e12, **_H100_MEMORY, nvlink_bandwidth=900e9 / 2, sm_count=132,
            **_H100_GEMMS, matmul_ceiling_source=f"{MAMF_SOURCE}, H100 SXM",
            hbm_ceiling=HBM_H100_SXM_CEILING, hbm_ceiling_source=HBM_H100_SXM_SOURCE,
            tdp_watts=700,
        ),
        DeviceSpec(
            name="h100-pcie", compute_capability=(9, 0),
            peak_flops=_H100_PCIE,
            hbm_bandwidth=2.0e12, memory_bytes=_H100_MEMORY["memory_bytes"],
            memory_source="assumed as h100-sxm's: " + _H100_MEMORY["memory_source"],
            nvlink_bandwidth=600e9 / 2, sm_count=114,
            **_AS_H100_SXM,
            hbm_ceiling=HBM_A100_CEILING, hbm_ceiling_source=_HBM_ASSUMED, tdp_watts=350,
        ),
        DeviceSpec(
            name="h100-nvl", compute_capability=(9, 0),
            peak_flops=_H100_NVL,
            hbm_bandwidth=3.9e12, memory_bytes=94e9, nvlink_bandwidth=600e9 / 2, sm_count=132,
            **_AS_H100_SXM,
            hbm_ceiling=HBM_A100_CEILING, hbm_ceiling_source=_HBM_ASSUMED, tdp_watts=400,
        ),
        DeviceSpec(
            name="h200-sxm", compute_capability=(9, 0),
            peak_flops=_H100_SXM,
            hbm_bandwidth=4.8e12, memory_bytes=139.81 * GIB, nvlink_bandwidth=900e9 / 2,
            sm_count=132, memory_source="CUDA's total, 139.81 GiB (arxiv_confi etu_logging)",
            # bf16: the H100 SXM row's note "H200 is the same"; fp8: the H200 SXM row.
            matmul_ceiling={"bf16": _H100_MAMF["bf16"], **_mamf(_H100_SXM, fp8=1453.4)},
            matmul_ceiling_source=f"{MAMF_SOURCE}, H200 SXM fp8; bf16 from H100 SXM ('H200 is the same')",
            hbm_ceiling=HBM_A100_CEILING, hbm_ceiling_source=_HBM_ASSUMED, tdp_watts=700,
            matmul_best_shape={"bf16": _H100_BEST["bf16"], "fp8": (1280, 4096, 12032)},
            gemm_floor_s=_HOPPER_GEMM_FLOOR_S,
        ),
        DeviceSpec(
            name="b200", compute_capability=(10, 0),
            peak_flops=_B200,
            hbm_bandwidth=64e12 / 8, memory_bytes=178.36 * GIB, nvlink_bandwidth=1.8e12 / 2,
            memory_source="CUDA's total, 178.36 GiB (prime-rl BENCHMARKS.md, 8xB200)",
            sm_count=148,
            matmul_ceiling=_mamf(_B200, bf16=1745.0, fp8=3432.5),
            matmul_ceiling_source=f"{MAMF_SOURCE}, B200 SXM",
            hbm_ceiling=HBM_A100_CEILING, hbm_ceiling_source=_HBM_ASSUMED, tdp_watts=1000,
        ),
        DeviceSpec(
            name="gb200", compute_capability=(10, 0),
            peak_flops=_GB200,
            hbm_bandwidth=16e12 / 2, memory_bytes=372e9 / 2, nvlink_bandwidth=1.8e12 / 2,
            sm_count=148,
            matmul_ceiling=_mamf(_GB200, bf16=1822.0, fp8=3615.6),
            matmul_ceiling_source=f"{MAMF_SOURCE}, GB200 SXM",
            hbm_ceiling=HBM_A100_CEILING, hbm_ceiling_source=_HBM_ASSUMED, tdp_watts=1200,
        ),
        DeviceSpec(
            name="mi300x", peak_flops=_MI300X,
            hbm_bandwidth=5.3e12, memory_bytes=191.98 * GIB, nvlink_bandwidth=7 * 128e9 / 2,
            sm_count=304, memory_source="HIP's total, 191.98 GiB (ROCm blog, gptq)",
            matmul_ceiling={"bf16": _MI300X_BF16, "fp8": _MI300X_BF16},
            matmul_ceiling_source=f"{MAMF_SOURCE}, MI300X bf16; fp8 not measured, assumed as bf16",
            hbm_ceiling=HBM_A100_CEILING, hbm_ceiling_source=_HBM_ASSUMED, tdp_watts=750,
            interconnect="Infinity Fabric",
        ),
    )
}

# Lenient spellings (after lower-casing and '_'/' ' -> '-') -> canonical name.
_DEVICE_ALIASES = {
    "a100": "a100-80gb-sxm", "a100-80gb": "a100-80gb-sxm", "a100-sxm": "a100-80gb-sxm",
    "a100-sxm4-80gb": "a100-80gb-sxm", "a100-sxm-80gb": "a100-80gb-sxm",
    "a100-pcie": "a100-80gb-pcie", "a100-pcie-80gb": "a100-80gb-pcie",
    "a100-40gb": "a100-40gb-sxm", "a100-sxm4-40gb": "a100-40gb-sxm", "a100-sxm-40gb": "a100-40gb-sxm",
    "h100": "h100-sxm", "h100-sxm5": "h100-sxm", "h100-80gb": "h100-sxm",
    "h100-sxm-80gb": "h100-sxm", "h100-sxm5-80gb": "h100-sxm", "h100-80gb-hbm3": "h100-sxm",
    "h100-pcie-80gb": "h100-pcie", "h100-80gb-pcie": "h100-pcie",
    "h100-nvl-94gb": "h100-nvl", "h100nvl": "h100-nvl",
    "h200": "h200-sxm", "h200-141gb": "h200-sxm", "h200-sxm-141gb": "h200-sxm",
    "b200-sxm": "b200", "b200-180gb": "b200", "gb200-sxm": "gb200", "gb200-186gb": "gb200",
    "mi300": "mi300x", "amd-mi300x": "mi300x", "instinct-mi300x": "mi300x",
    "amd-instinct-mi300x": "mi300x", "mi300x-192gb": "mi300x",
}


def canonical_device_name(name: str) -> str:
    """The canonical registry name for `name` (case-insensitive, aliases like 'h100')."""
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    key = _DEVICE_ALIASES.get(key, key)
    if key not in DEVICES:
        raise TopologyError(
            f"unknown device {name!r}; known devices: {', '.join(sorted(DEVICES))} "
            f"(aliases: {', '.join(sorted(_DEVICE_ALIASES))})"
        )
    return key


def get_device(name: str) -> DeviceSpec:
    """The DeviceSpec for `name` (lenient: case-insensitive, aliases like 'a100', 'h100')."""
    return DEVICES[canonical_device_name(name)]
