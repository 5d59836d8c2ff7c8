"""Flash-attention kernel times from a calibration profile's attention section
(schedules.profile.AttentionTimes, measured by `clustersim calibrate`), for the roofline's
attention kernels (sim.cost.RooflineCost.attention_seconds, type sim.cost.AttentionSeconds).

A measured point (batch b, heads h, kv heads, sequence s, head dim d) has model FLOPs
4 b h s^2 d in the forward and twice that in the backward: the FLOPs
schedules.layer_kernels gives its flash_attention kernels (full score matrix; the kernels'
causal `work` is a fixed share of it, so rates compare alike). A kernel of the same dtype
and pass attending over a measured sequence length s is priced at the rate the points of
that s reach at the FLOPs of one of its calls (one layer's: a stage's kernel sums its
layers, an I or W takes half a backward), interpolated log-linearly in FLOPs (at one s,
FLOPs grow with b h d: heads per TP rank, micro-batch) between the two points around it;
exactly a point's time at its FLOPs, times the calls the kernel stands for. None (the
published curve or the roofline prices it) for another dtype, a sequence length that was
not measured (context parallelism's s/cp, another --seq-length), or FLOPs outside the
measured range: the table interpolates and never extrapolates. Units: seconds, FLOPs,
FLOP/s.
"""
from __future__ import annotations

import bisect
import math

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.layer_kernels import Kernel
from clustersim.schedules.profile import AttentionTimes, Profile

from .cost import AttentionSeconds

PASSES = ("forward", "backward")
BACKWARD_FLOPS = 2.0  # backward model FLOPs / forward (schedules.layer_kernels.layer_backward)


class AttentionTable:
    """Interpolated flash-attention times from measured points (module docstring)."""

    def __init__(self, times: AttentionTimes):
        if not times.causal:
            raise ConfigError("profile field attention.causal is false: the simulated "
                              "attention is causal; calibrate again")
        self.dtype = times.dtype
        self._rates: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for b, h, _kv, s, d, forward, backward in times.points:
            flops = 4.0 * b * h * s * s * d
            for phase, seconds, scale in (("forward", forward, 1.0),
                                          ("backward", backward, BACKWARD_FLOPS)):
                self._rates.setdefault((int(s), phase), []).append(
                    (math.log(scale * flops), math.log(scale * flops / seconds)))
        for points in self._rates.values():
            points.sort()

    @staticmethod
    def from_profile(profile: Profile) -> AttentionTable | None:
        return None if profile.attention is None else AttentionTable(profile.attention)

    def rate(self, seq_length: float, phase: str, flops: float) -> float | None:
        """FLOP/s of a `phase` kernel of `flops` model FLOPs over `seq_length` tokens, or
        None (module docstring)."""
        if flops <= 0 or abs(seq_length - round(seq_length)) > 1e-9 * seq_length:
            return None
        points = self._rates.get((round(seq_length), phase))
        if not points:
            return None
        x = math.log(flops)
        xs = [p[0] for p in points]
        i = bisect.bisect_left(xs, x - 1e-9)
        if i < len(xs) and abs(xs[i] - x) <= 1e-9:
            return math.exp(points[i][1])
        if i == 0 or i == len(xs):
            return None
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))

    def seconds(self, kernel: Kernel, dtype: str) -> float | None:
        """Seconds of a flash kernel in `dtype` (sim.cost.AttentionSeconds), or None."""
        if dtype != self.dtype or kernel.attention is None:
            return None
        seq_length, phase, call = kernel.attention
        rate = self.rate(seq_length, phase, call)  # one layer's call sets the speed
        return None if rate is None else kernel.flops / rate


def attention_seconds_of(profile: Profile | None) -> AttentionSeconds | None:
    """The RooflineCost.attention_seconds hook of a profile's attention section, or None
    when there is no profile or it has none."""
    table = None if profile is None else AttentionTable.from_profile(profile)
    return None if table is None else table.seconds
