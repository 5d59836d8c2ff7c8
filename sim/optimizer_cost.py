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
- ZeRO-Infinity's NVMe tier (offload_device 'nvme'; Rajbhandari et al., SC21): the
  states live on the node's NVMe, and DeepSpeed's ZeRO-3 step (runtime/zero/stage3.py
  `step`: per optimizer sub-group `_prepare_sub_group` -> swap_in_optimizer_state, the CPU
  Adam step, `_release_sub_group` -> swap_out_optimizer_state) reads each partition's K
  bytes per parameter (fp32 master weight, momentum, variance: ZeRO's K = 12,
  schedules.memory_model.precision_bytes) into pinned buffers, steps it and writes it
  back. The default swapper (PartitionedOptimizerSwapper: offload_optimizer.pipeline_read
  and pipeline_write default False, runtime/zero/offload_config.py) waits for each read
  and write, so the step adds 2 K params / (B / k) seconds to the CPU Adam time: the
  node's NVMe bandwidth B (bytes/s, read and write alike; ParallelConfig.nvme_bandwidth,
  the user's number: no datasheet here gives it) is shared by the k ranks on the node
  swapping at once, as the host CPU is (NvmeTier). Not counted: DeepSpeed's fp32 gradient
  partitions, swapped out during the backward and in before the step (4 B per parameter
  each way).
Units: seconds, bytes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clustersim.schedules.dp_sizes import ADAM_BYTES_PER_PARAM
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.memory_model import precision_bytes
from clustersim.schedules.names import HOST
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.plan import Plan
from clustersim.topologies import DeviceSpec

CPU_ADAM_SECONDS_PER_PARAM = 0.22e-9


@dataclass(frozen=True)
class NvmeTier:
    """ZeRO-Infinity's NVMe tier (module docstring): `bandwidth` bytes/s of a node's NVMe,
    read and write alike; `state_bytes_per_param` K swapped in and out per parameter."""

    bandwidth: float
    state_bytes_per_param: int

    def swap_seconds(self, params: float, host_ranks: int = 1) -> float:
        """Seconds to read `params` parameters' states and write them back, with
        `host_ranks` ranks of the node doing the same at once: 2 K params / (B / k)."""
        return 2 * self.state_bytes_per_param * params * host_ranks / self.bandwidth


def step_params(op: Op) -> float:
    """Parameters an OPT_STEP updates: its nbytes / ADAM_BYTES_PER_PARAM."""
    return op.nbytes / ADAM_BYTES_PER_PARAM


def optimizer_step_time(op: Op, device: DeviceSpec, memory_efficiency: float,
                        cpu_seconds_per_param: float = CPU_ADAM_SECONDS_PER_PARAM,
                        gpu_seconds_per_param: float | None = None,
                        host_ranks: int = 1, nvme: NvmeTier | None = None) -> float:
    """Seconds of OPT_STEP `op`: on the host at `cpu_seconds_per_param`, shared by the
    `host_ranks` ranks stepping on it at once, plus with `nvme` the states' swap in and
    out; on the GPU at `gpu_seconds_per_param` (measured) when given, else its bytes at
    `memory_efficiency` of the HBM bandwidth."""
    if op.group == HOST:
        params = step_params(op)
        swap = nvme.swap_seconds(params, host_ranks) if nvme else 0.0
        return params * host_ranks * cpu_seconds_per_param + swap
    if gpu_seconds_per_param is not None:
        return step_params(op) * gpu_seconds_per_param
    return op.nbytes / (device.hbm_bandwidth * memory_efficiency)


def offload_options(plan: Plan) -> dict[str, Any]:
    """`with_optimizer_steps`' host arguments for `plan`: the ranks sharing each stage's
    host (Plan.ranks_on_host) and, with offload_device 'nvme', its NvmeTier; ConfigError
    when the NVMe bandwidth is not given."""
    parallel = plan.parallel
    if not parallel.nvme_offload:
        return {"host_ranks_of_stage": plan.ranks_on_host}
    if parallel.nvme_bandwidth is None:
        raise ConfigError("offload_device 'nvme' needs the node's NVMe bandwidth, "
                          "--nvme-bandwidth GB/s (nvme_bandwidth): no datasheet gives it and "
                          "DeepSpeed has no such key; measure it (e.g. DeepSpeed's ds_nvme_tune)")
    return {"host_ranks_of_stage": plan.ranks_on_host,
            "nvme": NvmeTier(parallel.nvme_bandwidth, precision_bytes(plan.model.dtype)[1])}


def with_optimizer_steps(compute_time: Callable[[Op], float], device_of_stage,
                         memory_fraction: Callable[[DeviceSpec], float],
                         gpu_seconds_per_param: float | None = None,
                         host_ranks_of_stage: Callable[[int], int] = lambda stage: 1,
                         nvme: NvmeTier | None = None) -> Callable[[Op], float]:
    """`compute_time` with OPT_STEP costed here; `device_of_stage(s)` is the DeviceSpec of
    stage s, `memory_fraction(device)` the fraction of its HBM bandwidth a step reaches
    (sim.cost.memory_fraction); `gpu_seconds_per_param`: a profile's measured step (None:
    the HBM roofline); `host_ranks_of_stage(s)`: the ranks sharing the host CPU (and NVMe)
    of stage s's rank; `nvme`: the offloaded states' NVMe tier (offload_options)."""
    def timed(op: Op) -> float:
        if op.kind is OpKind.OPT_STEP:
            device = device_of_stage(op.stage)
            return optimizer_step_time(op, device, memory_fraction(device),
                                       gpu_seconds_per_param=gpu_seconds_per_param,
                                       host_ranks=host_ranks_of_stage(op.stage), nvme=nvme)
        return compute_time(op)

    return timed
