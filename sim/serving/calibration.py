"""Serving's compute rates from measured inference steps: a calibration profile's `serving`
section (schedules.profile.ServingTimes; `clustersim calibrate --serving` runs
kernels.serving_steps) fitted to the step cost's model of one layer on one GPU,

    t = overhead + roofline(GEMMs) + roofline(attention),  roofline(f, b) = max(f / F, b / B)

with the FLOPs and bytes of StepCost.layer_work (tp 1, the profile's model), fitted to
every decode point (B sequences after c cached tokens) and prefill point (one prompt of
T tokens) at once: the (F, B) minimising the sum of squared relative errors, each pair
with its best overhead (a weighted mean, clamped at 0), found on a log grid (F 1e6 to
1e18 FLOP/s, B 1e6 to 1e15 bytes/s, steps of 0.05 decades) refined five times tenfold
around the best. No regime is assumed: a CPU's decode of a large batch is compute-bound,
a GPU's memory-bound, and the roofline's max picks for each point. The output layer's
points (StepCost.head_work) are not fitted: they are reported as a check, as is every
point (`residuals`). Units: seconds, FLOPs, bytes.

Where it applies: the profile's rates stand for the serving GPU's (as `simulate
--profile` takes a profile's times for the topology's GPUs); the profile must be measured
at the served model's layer shapes and in the serving dtype (`check_serving_profile`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import DTYPE_BYTES, ModelSpec
from clustersim.schedules.profile import Profile

from .kv_cache import kv_bytes_per_token
from .step_cost import StepCost

SHAPE_FIELDS = ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "vocab_size", "swiglu", "add_bias_linear", "normalization",
                "untie_embeddings_and_output_weights")
"""The model fields a serving profile's layer and output layer were measured at."""
GRID = {"flops": (6.0, 18.0), "bytes": (6.0, 15.0)}  # log10 ranges searched
GRID_STEP, ZOOMS = 0.05, 5  # decades between grid points; tenfold refinements


@dataclass(frozen=True)
class ServingRates:
    """Fitted rates of one GPU: `flops_per_s` (F), `bytes_per_s` (B), `overhead` (s per
    layer per step), and each measured point's (label, measured s, modelled s)."""

    flops_per_s: float
    bytes_per_s: float
    overhead: float
    residuals: tuple[tuple[str, float, float], ...]

    def worst_error(self) -> float:
        """The largest |modelled / measured - 1| over the points."""
        return max(abs(model / measured - 1) for _, measured, model in self.residuals)


def check_serving_profile(profile: Profile, model: ModelSpec, dtype: str) -> None:
    """ConfigError unless `profile` has serving steps measured at `model`'s layer shapes
    (SHAPE_FIELDS) in `dtype` (the serving dtype: 'bf16', 'fp16')."""
    if profile.serving is None:
        raise ConfigError("the profile has no serving section: calibrate with "
                          "`clustersim calibrate --serving` at the model's flags")
    for name in SHAPE_FIELDS:
        if name in profile.model and profile.model[name] != getattr(model, name):
            raise ConfigError(f"profile does not match the model: {name}: the profile was "
                              f"measured at {profile.model[name]!r}, the model has "
                              f"{getattr(model, name)!r}; recalibrate with `clustersim "
                              f"calibrate --serving` at these model flags")
    if profile.serving.dtype != dtype:
        raise ConfigError(f"profile field serving.dtype is {profile.serving.dtype}; serving "
                          f"runs in {dtype}: recalibrate with --dtype {dtype}")


def _layer_cost(model: ModelSpec, dtype: str) -> StepCost:
    """One layer at tp 1 with unit rates: its layer_work and head_work give FLOPs, bytes."""
    element = DTYPE_BYTES[dtype]
    per_layer = kv_bytes_per_token(model, element) / model.num_layers
    return StepCost(model, 1, 1.0, 1.0, element, element, per_layer, None, 1)


def _modelled(work, flops_per_s, bytes_per_s, overhead: float):
    """overhead + each kernel group's roofline; the rates (and work) may be arrays."""
    return overhead + sum(np.maximum(f / flops_per_s, b / bytes_per_s) for f, b in work)


def _search(work: list, seconds: np.ndarray) -> tuple[float, float, float]:
    """(F, B, overhead) minimising the squared relative errors of `work` (each point's
    [(FLOPs, bytes)] per kernel group) against `seconds` (module docstring)."""
    flops = [np.array([group[k][0] for group in work]) for k in range(len(work[0]))]
    nbytes = [np.array([group[k][1] for group in work]) for k in range(len(work[0]))]
    weight = 1 / seconds ** 2
    axes = [np.arange(lo, hi + GRID_STEP / 2, GRID_STEP) for lo, hi in GRID.values()]
    for _ in range(ZOOMS + 1):
        log_f, log_b = np.meshgrid(*axes, indexing="ij")
        f_rate, b_rate = 10.0 ** log_f[..., None], 10.0 ** log_b[..., None]
        roofline = _modelled(list(zip(flops, nbytes)), f_rate, b_rate, 0.0)
        overhead = np.maximum(0.0, ((seconds - roofline) * weight).sum(-1) / weight.sum())
        error = (((roofline + overhead[..., None] - seconds) / seconds) ** 2).sum(-1)
        i, j = np.unravel_index(np.argmin(error), error.shape)
        best = (float(10.0 ** log_f[i, j]), float(10.0 ** log_b[i, j]), float(overhead[i, j]))
        axes = [np.linspace(axis[k] - 2 * (axis[1] - axis[0]),
                            axis[k] + 2 * (axis[1] - axis[0]), 41)
                for axis, k in zip(axes, (i, j))]
    return best


def fit_serving(profile: Profile, model: ModelSpec, dtype: str) -> ServingRates:
    """The rates fitted to `profile`'s serving steps measured in `dtype` (module
    docstring)."""
    check_serving_profile(profile, model, dtype)
    cost, times = _layer_cost(model, dtype), profile.serving
    decode = [(cost.layer_work([(1, c)] * b), t) for b, c, t in times.decode]
    prefill = [(cost.layer_work([(n, 0)]), t) for n, t in times.prefill]
    points = decode + prefill
    rates = _search([work for work, _ in points], np.array([t for _, t in points]))
    residuals = ([(f"decode batch {b} context {c}", t, float(_modelled(work, *rates)))
                  for (b, c, t), (work, _) in zip(times.decode, decode)]
                 + [(f"prefill {n} tokens", t, float(_modelled(work, *rates)))
                    for (n, t), (work, _) in zip(times.prefill, prefill)]
                 + [(f"head {rows} rows", t,
                     float(_modelled([cost.head_work(rows)], *rates)))
                    for rows, t in times.head])
    return ServingRates(*rates, tuple(residuals))
