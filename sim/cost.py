"""Compute cost models: seconds for one compute op on one device.

- `RooflineCost`: time = max(flops / (peak * compute_efficiency),
  nbytes / (hbm_bandwidth * memory_efficiency)) — the roofline model (Williams, Waterman &
  Patterson, CACM 2009) with achievable fractions of the datasheet peaks — applied to each
  kernel of an op and summed (`kernels_time`; the kernels of F/B/I/W come from
  schedules.layer_kernels via `StageKernelCost`), or to the op as a whole when it has no
  kernel list. The defaults (0.6 of dense peak FLOP/s, 0.8 of HBM bandwidth) are
  assumptions, not measurements; override them, or replace the model by a profile
  calibrated with `kernels`.
- `UniformCost`: fixed seconds per op kind (F and B of one virtual stage on one
  microbatch; I and W each take half of B), for checking schedules against closed forms.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clustersim.schedules.costs import StageCost
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import Kernel
from clustersim.schedules.ops import Op, OpKind
from clustersim.topologies import DeviceSpec

DEFAULT_COMPUTE_EFFICIENCY = 0.6
DEFAULT_MEMORY_EFFICIENCY = 0.8


def _check_fraction(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ConfigError(f"{name} must be in (0, 1], got {value}")


@dataclass(frozen=True)
class RooflineCost:
    device: DeviceSpec
    dtype: str = "bf16"
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY

    def __post_init__(self) -> None:
        _check_fraction("compute_efficiency", self.compute_efficiency)
        _check_fraction("memory_efficiency", self.memory_efficiency)
        self.device.peak(self.dtype)  # fail early on a dtype the device lacks

    def time(self, flops: float, nbytes: float) -> float:
        compute = flops / (self.device.peak(self.dtype) * self.compute_efficiency)
        memory = nbytes / (self.device.hbm_bandwidth * self.memory_efficiency)
        return max(compute, memory)

    def kernels_time(self, kernels: Iterable[Kernel]) -> float:
        """Kernels run one after another: the sum of their rooflines."""
        return sum(self.time(k.flops, k.nbytes) for k in kernels)

    def __call__(self, op: Op) -> float:
        return self.time(op.flops, op.nbytes)


class StageKernelCost:
    """Seconds of a compute op as the sum of its kernels' rooflines on the device of its
    stage: F runs the stage's forward kernels, B its backward kernels, I and W half of
    them each (the FLOP split of schedules.annotate). Other ops (optimizer steps, ...) use
    their aggregate roofline. Times are cached per (kind, stage, layer group)."""

    def __init__(self, rooflines: Sequence[RooflineCost], costs: Sequence[StageCost],
                 chunk_costs: Sequence[Sequence[StageCost]] | None = None):
        self._rooflines, self._costs, self._chunk_costs = rooflines, costs, chunk_costs
        self._seconds: dict[tuple, float] = {}

    def _kernels(self, op: Op) -> Iterable[Kernel] | None:
        c = self._costs[op.stage] if op.chunk is None else self._chunk_costs[op.stage][op.chunk]
        if op.kind is OpKind.F:
            return c.forward_kernels
        if op.kind is OpKind.B:
            return c.backward_kernels
        if op.kind in (OpKind.I, OpKind.W):
            return [k.scaled(0.5) for k in c.backward_kernels]
        return None

    def __call__(self, op: Op) -> float:
        key = (op.kind, op.stage, op.chunk)
        seconds = self._seconds.get(key)
        if seconds is None:
            kernels = self._kernels(op)
            roofline = self._rooflines[op.stage]
            seconds = roofline(op) if kernels is None else roofline.kernels_time(kernels)
            if kernels is not None:
                self._seconds[key] = seconds
        return seconds


@dataclass(frozen=True)
class UniformCost:
    forward: float
    backward: float

    def __post_init__(self) -> None:
        for name, value in (("forward", self.forward), ("backward", self.backward)):
            if not value >= 0:
                raise ConfigError(f"uniform cost {name} must be >= 0 seconds, got {value}")

    def __call__(self, op: Op) -> float:
        if op.kind is OpKind.F:
            return self.forward
        if op.kind is OpKind.B:
            return self.backward
        if op.kind in (OpKind.I, OpKind.W):
            return self.backward / 2
        return 0.0


def parse_uniform_costs(text: str) -> UniformCost:
    """`"F,B"` in seconds, e.g. `"1,2"`."""
    parts = text.split(",")
    try:
        forward, backward = (float(p) for p in parts)
    except ValueError:
        raise ConfigError(
            f"--uniform-costs must be two numbers of seconds 'F,B' such as '1,2', got {text!r}"
        ) from None
    return UniformCost(forward, backward)
