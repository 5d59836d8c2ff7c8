"""GPU device datasheet specs: peak dense FLOP/s per dtype, HBM and NVLink bandwidth.

Units: FLOP/s, bytes/s, bytes (1 GB = 1e9 bytes, as on the datasheets). All FLOP/s are
*dense* tensor-core peaks (the datasheets' headline numbers with sparsity are 2x these).
The 'fp32' key is TF32 dense tensor-core throughput, which is what fp32 matmuls use under
PyTorch's `allow_tf32`; plain FP32 CUDA-core peaks are much lower (19.5 / 67 TFLOP/s).
NVLink bandwidth is per GPU, aggregate over its links, per direction (datasheets quote the
bidirectional total, i.e. 2x).

Sources:
- NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): BF16/FP16 312 TFLOPS, TF32
  156 TFLOPS, HBM2e 2,039 GB/s, 80 GB, NVLink 600 GB/s.
- NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): FP8 3,958 / BF16 1,979 / TF32 989
  TFLOPS with sparsity (dense: 1,978.9 / 989.4 / 494.7), HBM3 3.35 TB/s, 80 GB,
  NVLink 900 GB/s.
- NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): compute as H100 SXM, HBM3e 4.8 TB/s,
  141 GB, NVLink 900 GB/s.
- NVIDIA A100 datasheet (A100 80GB PCIe): BF16/FP16 312 / TF32 156 TFLOPS, HBM2e
  1,935 GB/s, 80 GB.
- SMs: 108 on an A100 (NVIDIA A100 Tensor Core GPU Architecture whitepaper), 132 on an
  H100 SXM5 (NVIDIA H100 Tensor Core GPU Architecture whitepaper; the H200 is the same
  GPU). Its optional 2-GPU NVLink bridge is not modelled: nvlink_bandwidth
  is 0, which only PCIe devices (name containing 'pcie') may have.
"""
from __future__ import annotations

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
}


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model's datasheet numbers (see module docstring for units and sources)."""

    name: str
    peak_flops: Mapping[str, float] = field(hash=False)  # dense FLOP/s per dtype key
    hbm_bandwidth: float  # bytes/s
    memory_bytes: float  # bytes
    nvlink_bandwidth: float  # bytes/s per direction, per GPU, all links together
    sm_count: int  # streaming multiprocessors (what communication kernels take from GEMMs)

    def __post_init__(self) -> None:
        # Read-only copy so the registry's shared instances cannot be mutated.
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))
        nvlink = self.nvlink_bandwidth
        if not isinstance(nvlink, (int, float)) or nvlink < 0 or (nvlink == 0 and "pcie" not in self.name):
            raise TopologyError(
                f"device {self.name!r}: nvlink_bandwidth must be > 0 bytes/s (0 only for "
                f"PCIe devices, whose name contains 'pcie'), got {nvlink!r}")

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype` ('bf16', 'bfloat16', 'fp32', 'tf32', ...)."""
        key = _DTYPE_ALIASES.get(str(dtype).strip().lower())
        if key is None or key not in self.peak_flops:
            raise TopologyError(
                f"device {self.name!r} has no peak FLOP/s for dtype {dtype!r}; "
                f"it has: {', '.join(sorted(self.peak_flops))}"
            )
        return self.peak_flops[key]


DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        DeviceSpec(
            name="a100-80gb-sxm",
            peak_flops={"bf16": 312e12, "fp16": 312e12, "fp32": 156e12},
            hbm_bandwidth=2039e9,
            memory_bytes=80e9,
            nvlink_bandwidth=300e9,
            sm_count=108,
        ),
        DeviceSpec(
            name="a100-80gb-pcie",
            peak_flops={"bf16": 312e12, "fp16": 312e12, "fp32": 156e12},
            hbm_bandwidth=1935e9,
            memory_bytes=80e9,
            nvlink_bandwidth=0.0,
            sm_count=108,
        ),
        DeviceSpec(
            name="h100-sxm",
            peak_flops={"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 494.7e12, "fp8": 1978.9e12},
            hbm_bandwidth=3.35e12,
            memory_bytes=80e9,
            nvlink_bandwidth=450e9,
            sm_count=132,
        ),
        DeviceSpec(
            name="h200-sxm",
            peak_flops={"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 494.7e12, "fp8": 1978.9e12},
            hbm_bandwidth=4.8e12,
            memory_bytes=141e9,
            nvlink_bandwidth=450e9,
            sm_count=132,
        ),
    )
}

# Lenient spellings (after lower-casing and '_'/' ' -> '-') -> canonical name.
_DEVICE_ALIASES = {
    "a100": "a100-80gb-sxm", "a100-80gb": "a100-80gb-sxm", "a100-sxm": "a100-80gb-sxm",
    "a100-sxm4-80gb": "a100-80gb-sxm",
    "a100-pcie": "a100-80gb-pcie",
    "h100": "h100-sxm", "h100-sxm5": "h100-sxm", "h100-80gb": "h100-sxm",
    "h100-sxm-80gb": "h100-sxm", "h100-sxm5-80gb": "h100-sxm",
    "h200": "h200-sxm", "h200-141gb": "h200-sxm", "h200-sxm-141gb": "h200-sxm",
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
