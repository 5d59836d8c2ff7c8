"""GEMM times from a calibration profile's table (schedules.profile.GemmTimes), for the
roofline's GEMM kernels (sim.cost.RooflineCost.gemm_seconds, type sim.cost.GemmSeconds).

`GemmTable.seconds(kernel, dtype)`: None unless `dtype` is the table's dtype; else the
seconds of ONE GEMM of the kernel's shape (M, N, K) (`gemm_time`) times the number of
such GEMMs the kernel stands for, kernel.executed / (2 M N K) (a stage's kernel sums its
L layers' GEMMs, schedules.layer_kernels.merge; an I or W op takes half of the backward
kernels, StageKernelCost), or None where the table has no answer for that shape.

`gemm_time(M, N, K)`, one GEMM:
- a measured shape: its measured seconds;
- otherwise 2MNK / rate, the achieved FLOP rate interpolated log-linearly: ln(rate) as a
  linear function of (ln M, ln N, ln K), fitted over the query's neighbours by weighted
  least squares (weights 1 / squared log-distance to the query, so the answer tends to a
  neighbour's rate as the query approaches it), then clamped to the neighbours' lowest
  and highest rate. The neighbours: the nearest measured shape (Euclidean distance in
  log-shape) in each of the 8 closed octants around the query, so the query lies in
  their convex hull: the table interpolates and never extrapolates. Shapes that share
  dimensions with the query are tried first: the measured shapes with the query's N and
  K (a 1-D interpolation along M: other micro-batch sizes), then those sharing any two
  dimensions, then one, then any shape; the first set that surrounds the query answers
  (among sets sharing equally many, the one with the nearest farthest neighbour).
  Between two shapes of one 1-D family this is exactly log-linear interpolation of the
  rate between them. A rate that is a product of powers of M, N and K (c M^a N^b K^g)
  is reproduced exactly wherever the table answers.
- None when no set of measured shapes surrounds the query (a shape outside the measured
  range on some axis, or in a corner of the grid no measurement spans): the roofline
  prices that GEMM. Shapes are matched to the table within a relative 1e-9.

Why the rate and not the time: between measured shapes a GEMM's time then scales with its
FLOPs at a smoothly varying efficiency, which is how GEMM speed behaves away from the
smallest shapes. What it cannot represent: the steps of tile and wave quantization on a
GPU (a shape one tile wider than a measured one can be markedly slower), which only
more measured shapes resolve.

Units: seconds, FLOPs, FLOP/s. numpy only.
"""
from __future__ import annotations

from itertools import combinations, product

import numpy as np

from clustersim.schedules.layer_kernels import Kernel
from clustersim.schedules.profile import GemmTimes, Profile

from .cost import GemmSeconds

TOLERANCE = 1e-9  # log-space distance within which two dimensions are equal (rel. 1e-9)


class GemmTable:
    """Interpolated GEMM times from measured (M, N, K, seconds) points (module docstring)."""

    def __init__(self, times: GemmTimes):
        self.dtype = times.dtype
        points = np.array([p[:3] for p in times.points], dtype=float)
        seconds = np.array([p[3] for p in times.points], dtype=float)
        self._exact = {tuple(int(d) for d in p[:3]): float(p[3]) for p in times.points}
        self._x = np.log(points)  # (n, 3): ln M, ln N, ln K
        self._y = np.log(2.0 * points.prod(axis=1) / seconds)  # ln FLOP/s
        self._cache: dict[tuple[float, float, float], float | None] = {}

    @staticmethod
    def from_profile(profile: Profile) -> GemmTable | None:
        """The table of the profile's `gemm` section, or None when it has none."""
        return None if profile.gemm is None else GemmTable(profile.gemm)

    # --- one GEMM ------------------------------------------------------------------------
    def gemm_time(self, m: float, n: float, k: float) -> float | None:
        """Seconds of one (M x K) @ (K x N) GEMM: measured, interpolated, or None
        (module docstring)."""
        key = (float(m), float(n), float(k))
        if key not in self._cache:
            self._cache[key] = self._time(key)
        return self._cache[key]

    def rate(self, m: float, n: float, k: float) -> float | None:
        """Achieved FLOP/s of one GEMM, 2MNK / gemm_time, or None."""
        seconds = self.gemm_time(m, n, k)
        return None if seconds is None else 2.0 * m * n * k / seconds

    def neighbours(self, m: float, n: float, k: float) -> list[tuple[int, int, int]] | None:
        """The measured shapes the rate at (M, N, K) is interpolated from (module
        docstring), or None when no set of them surrounds it."""
        found = self._neighbours(np.log([float(m), float(n), float(k)]))
        return None if found is None else [
            tuple(int(round(d)) for d in np.exp(self._x[i])) for i in found]

    def _time(self, key: tuple[float, float, float]) -> float | None:
        if min(key) <= 0 or not all(np.isfinite(key)):
            return None
        rounded = tuple(round(d) for d in key)
        if all(abs(d - r) <= TOLERANCE * d for d, r in zip(key, rounded)) \
                and rounded in self._exact:
            return self._exact[rounded]
        q = np.log(key)
        found = self._neighbours(q)
        if found is None:
            return None
        flops = 2.0 * key[0] * key[1] * key[2]
        return flops / float(np.exp(self._fit(q, found)))

    def _neighbours(self, q: np.ndarray) -> list[int] | None:
        """Indices of the nearest measured shape in each closed octant around q, from the
        first set of candidates (sharing 2, then 1, then 0 of q's dimensions) that has a
        shape in every octant; None if no set does."""
        delta = self._x - q
        distance = np.sqrt((delta ** 2).sum(axis=1))
        same = np.abs(delta) <= TOLERANCE  # (n, 3): dimension j equals q's
        for shared in (2, 1, 0):
            best: tuple[float, list[int]] | None = None
            for axes in combinations(range(3), shared):
                candidates = same[:, list(axes)].all(axis=1) if axes else \
                    np.ones(len(self._x), dtype=bool)
                picks = self._octant_picks(delta, distance, candidates)
                if picks is not None:
                    reach = float(distance[picks].max())
                    if best is None or reach < best[0]:
                        best = (reach, picks)
            if best is not None:
                return best[1]
        return None

    @staticmethod
    def _octant_picks(delta: np.ndarray, distance: np.ndarray, candidates: np.ndarray
                      ) -> list[int] | None:
        picks = set()
        for signs in product((-1.0, 1.0), repeat=3):
            inside = candidates & (delta * np.array(signs) >= -TOLERANCE).all(axis=1)
            if not inside.any():
                return None
            index = np.flatnonzero(inside)
            picks.add(int(index[np.argmin(distance[index])]))
        return sorted(picks)

    def _fit(self, q: np.ndarray, found: list[int]) -> float:
        """ln(rate) at q: the weighted least-squares plane through the neighbours' ln
        rates over ln shape (weights 1/distance^2, centred on their weighted mean, the
        minimum-norm slope where they span fewer than 3 dimensions), clamped to their
        lowest and highest ln rate."""
        x, y = self._x[found], self._y[found]
        d2 = ((x - q) ** 2).sum(axis=1)
        if d2.min() <= TOLERANCE ** 2:
            return float(y[np.argmin(d2)])
        w = 1.0 / d2
        x_mean = (w[:, None] * x).sum(axis=0) / w.sum()
        y_mean = float((w * y).sum() / w.sum())
        root = np.sqrt(w)[:, None]
        slope, *_ = np.linalg.lstsq(root * (x - x_mean), root[:, 0] * (y - y_mean),
                                    rcond=None)
        value = y_mean + float(slope @ (q - x_mean))
        return min(max(value, float(y.min())), float(y.max()))

    # --- sim.cost.GemmSeconds ------------------------------------------------------------
    def seconds(self, kernel: Kernel, dtype: str) -> float | None:
        """Seconds of a GEMM kernel in `dtype` (sim.cost.GemmSeconds): gemm_time of its
        shape times the GEMMs it stands for (kernel.executed / 2MNK); None for another
        dtype than the table's, a kernel without a shape, or a shape the table cannot
        interpolate."""
        if dtype != self.dtype or kernel.gemm is None:
            return None
        m, n, k = kernel.gemm
        one = self.gemm_time(m, n, k)
        if one is None:
            return None
        return one * kernel.executed / (2.0 * m * n * k)


def gemm_seconds_of(profile: Profile | None) -> GemmSeconds | None:
    """The RooflineCost.gemm_seconds hook of a profile's GEMM table, or None when there is
    no profile or it has no `gemm` section (the roofline prices every GEMM)."""
    table = None if profile is None else GemmTable.from_profile(profile)
    return None if table is None else table.seconds
