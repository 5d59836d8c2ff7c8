"""Compute time on a device: seconds for one compute op (the roofline cost model's part,
sim.cost_model).

- `RooflineCost`: time = max(flops / (peak * compute_efficiency),
  nbytes / (hbm_bandwidth * memory_efficiency)) — the roofline model (Williams, Waterman &
  Patterson, CACM 2009) with achievable fractions of the datasheet peaks — applied to each
  kernel of an op and summed (`kernels_time`; the kernels of F/B/I/W come from
  schedules.layer_kernels via `StageKernelCost`), or to the op as a whole when it has no
  kernel list. A GEMM kernel's compute term comes from `gemm_seconds` (measured GEMM
  times) where it has a measurement. The defaults (0.6 of dense peak FLOP/s, 0.8 of HBM
  bandwidth) are assumptions, not measurements; override them, or replace the model by a
  profile calibrated with `kernels`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from clustersim.schedules.annotate import work_costs
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.intra_layer import TP_OVERLAP_COMM_SMS, sm_margin_gemms
from clustersim.schedules.layer_kernels import FP8_GEMMS, Kernel
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.plan import Plan
from clustersim.topologies import DeviceSpec

DEFAULT_COMPUTE_EFFICIENCY = 0.6
DEFAULT_MEMORY_EFFICIENCY = 0.8


def check_fraction(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ConfigError(f"{name} must be in (0, 1], got {value}")


GemmSeconds = Callable[[Kernel, str], "float | None"]
"""(GEMM kernel, dtype) -> its measured seconds, or None where there is no measurement
(a table of GEMM times, issue 16 item 2); the roofline prices the rest."""


@dataclass(frozen=True)
class RooflineCost:
    device: DeviceSpec
    dtype: str = "bf16"
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY
    gemm_seconds: GemmSeconds | None = None

    def __post_init__(self) -> None:
        check_fraction("compute_efficiency", self.compute_efficiency)
        check_fraction("memory_efficiency", self.memory_efficiency)
        self.device.peak(self.dtype)  # fail early on a dtype the device lacks

    def time(self, flops: float, nbytes: float, dtype: str | None = None) -> float:
        """Roofline seconds of `flops` at the peak of `dtype` (default: the model's)."""
        peak = self.device.peak(dtype or self.dtype)
        compute = flops / (peak * self.compute_efficiency)
        memory = nbytes / (self.device.hbm_bandwidth * self.memory_efficiency)
        return max(compute, memory)

    def kernels_time(self, kernels: Iterable[Kernel], fewer_sms: frozenset[str] = frozenset(),
                     comm_sms: int = 0) -> float:
        """Kernels run one after another: the sum of their rooflines. Under 'fp8' only
        Transformer Engine's FP8 GEMMs (schedules.layer_kernels.FP8_GEMMS) run at the FP8
        peak; every other kernel at the bf16 one. Kernels named in `fewer_sms` share the
        GPU with communication kernels holding `comm_sms` SMs: their compute term takes
        sm_count / (sm_count - comm_sms) times as long."""
        slow = self.device.sm_count / (self.device.sm_count - comm_sms)
        total = 0.0
        for k in kernels:
            compute = self._compute_seconds(k)
            total += max(compute * slow if k.name in fewer_sms else compute,
                         self.time(0.0, k.nbytes))
        return total

    def _compute_seconds(self, kernel: Kernel) -> float:
        """A GEMM's measured time where `gemm_seconds` has one, else its work at the
        compute roofline."""
        dtype = self._dtype_of(kernel)
        if kernel.gemm is not None and self.gemm_seconds is not None:
            measured = self.gemm_seconds(kernel, dtype)
            if measured is not None:
                return measured
        return self.time(kernel.executed, 0.0, dtype)

    def _dtype_of(self, kernel: Kernel) -> str:
        if self.dtype == "fp8" and kernel.name not in FP8_GEMMS:
            return "bf16"
        return self.dtype

    def __call__(self, op: Op) -> float:
        return self.time(op.flops, op.nbytes)


class StageKernelCost:
    """Seconds of a compute op as the sum of its kernels' rooflines on the device of its
    stage (`rooflines[s]`): F runs the stage's forward kernels, B its backward kernels, I
    and W half of them each (the FLOP split of schedules.annotate), from the plan's costs
    of the stage or layer group (Plan.costs_of). FLOPs an op carries beyond what the costs
    pass gave it (the busiest expert's extra GEMM work under moe_imbalance,
    schedules.ep_comms.imbalance_flops) run at the compute roofline: the expert GEMMs are
    compute-bound, so the busiest expert's GEMMs take f times their balanced time. Other
    ops (optimizer steps, ...) use their aggregate roofline. Under TP overlap the GEMMs
    that share the GPU with Transformer Engine's communication kernels run on the SMs
    those leave (schedules.intra_layer.sm_margin_gemms). Kernel times are cached per
    (kind, stage, layer group)."""

    def __init__(self, rooflines: Sequence[RooflineCost], plan: Plan):
        self._rooflines, self._plan = rooflines, plan
        self._seconds: dict[tuple, tuple[float, float]] = {}  # key -> (seconds, base FLOPs)

    def _kernels(self, op: Op) -> Iterable[Kernel] | None:
        c = self._plan.costs_of(op.stage, op.chunk)
        if op.kind is OpKind.F:
            return c.forward_kernels
        if op.kind is OpKind.B:
            return c.backward_kernels
        if op.kind in (OpKind.I, OpKind.W):
            return [k.scaled(0.5) for k in c.backward_kernels]
        return None

    def __call__(self, op: Op) -> float:
        key = (op.kind, op.stage, op.chunk)
        hit = self._seconds.get(key)
        if hit is None:
            kernels = self._kernels(op)
            roofline = self._rooflines[op.stage]
            if kernels is None:
                return roofline(op)
            base = work_costs(op.kind, self._plan.costs_of(op.stage, op.chunk))[0]
            slowed = sm_margin_gemms(self._plan.parallel, self._plan.model, op.kind)
            hit = self._seconds[key] = (
                roofline.kernels_time(kernels, slowed, TP_OVERLAP_COMM_SMS), base)
        seconds, base = hit
        if op.flops > base:  # imbalanced experts (class docstring)
            seconds += self._rooflines[op.stage].time(op.flops - base, 0.0)
        return seconds
