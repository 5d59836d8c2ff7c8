"""Seconds of an optimizer step (OPT_STEP), on the GPU or, offloaded, on the host CPU.

- On the GPU the mixed-precision Adam update is memory-bound: its traffic is
  OPT_STEP.nbytes = schedules.dp_sizes.ADAM_BYTES_PER_PARAM (28) bytes per parameter
  of the rank's shard, at the device's HBM bandwidth times the memory fraction (the
  roofline's; sim.cost). Its FLOPs (~10 per parameter) are negligible beside that.
  With a calibrated profile that measured it (schedules.profile
  optimizer_seconds_per_param: kernels.optimizer.FlatAdam.step timed on the calibrating
  device), a GPU step is instead parameters x those seconds per parameter.
- On the host (group 'host', ZeRO-Offload): CPU_ADAM_SECONDS_PER_PARAM per parameter.
  Source: Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training", USENIX
  ATC 2021, section 5 / the Adam-latency table, which (as we read it) times DeepSpeed's
  vectorised CPU-Adam at about 0.22 s per 1e9 parameters on a DGX-2 host (two 24-core
  Xeon Platinum 8168), 5-7x faster than PyTorch's CPU Adam. We take 0.22e-9 s/param: an
  assumption for a modern 2-socket host, not a measurement; change the constant (or pass
  `cpu_seconds_per_param`) for another host. That rate is the whole host's (all its
  cores, its memory bandwidth), and every GPU of the host offloads to it: the k ranks on
  one host step at once (by symmetry, at the same moment), so each rank's step takes
  k x its parameters x the per-parameter time (`host_ranks`, Plan.ranks_on_host).
Units: seconds, bytes.
"""
from __future__ import annotations

from collections.abc import Callable

from clustersim.schedules.dp_sizes import ADAM_BYTES_PER_PARAM
from clustersim.schedules.names import HOST
from clustersim.schedules.ops import Op, OpKind
from clustersim.topologies import DeviceSpec

CPU_ADAM_SECONDS_PER_PARAM = 0.22e-9


def step_params(op: Op) -> float:
    """Parameters an OPT_STEP updates: its nbytes / ADAM_BYTES_PER_PARAM."""
    return op.nbytes / ADAM_BYTES_PER_PARAM


def optimizer_step_time(op: Op, device: DeviceSpec, memory_efficiency: float,
                        cpu_seconds_per_param: float = CPU_ADAM_SECONDS_PER_PARAM,
                        gpu_seconds_per_param: float | None = None,
                        host_ranks: int = 1) -> float:
    """Seconds of OPT_STEP `op`: on the host at `cpu_seconds_per_param`, shared by the
    `host_ranks` ranks stepping on it at once; on the GPU at `gpu_seconds_per_param`
    (measured) when given, else its bytes at `memory_efficiency` of the HBM bandwidth."""
    if op.group == HOST:
        return step_params(op) * host_ranks * cpu_seconds_per_param
    if gpu_seconds_per_param is not None:
        return step_params(op) * gpu_seconds_per_param
    return op.nbytes / (device.hbm_bandwidth * memory_efficiency)


def with_optimizer_steps(compute_time: Callable[[Op], float], device_of_stage,
                         memory_fraction: Callable[[DeviceSpec], float],
                         gpu_seconds_per_param: float | None = None,
                         host_ranks_of_stage: Callable[[int], int] = lambda stage: 1
                         ) -> Callable[[Op], float]:
    """`compute_time` with OPT_STEP costed here; `device_of_stage(s)` is the DeviceSpec of
    stage s, `memory_fraction(device)` the fraction of its HBM bandwidth a step reaches
    (sim.cost.memory_fraction); `gpu_seconds_per_param`: a profile's measured step (None:
    the HBM roofline); `host_ranks_of_stage(s)`: the ranks sharing the host CPU of stage
    s's rank."""
    def timed(op: Op) -> float:
        if op.kind is OpKind.OPT_STEP:
            device = device_of_stage(op.stage)
            return optimizer_step_time(op, device, memory_fraction(device),
                                       gpu_seconds_per_param=gpu_seconds_per_param,
                                       host_ranks=host_ranks_of_stage(op.stage))
        return compute_time(op)

    return timed
