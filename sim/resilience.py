"""Checkpoints, failures and the goodput of a long training run.

A synchronous job stops whole when any of its GPUs fails (Llama 3, Dubey et al. 2024,
section 3.3.4: "a single GPU failure may require a restart of the entire job") and
restarts from its last checkpoint, losing the work since. With failures a Poisson process
of rate 1/M (M: the job's mean time between failures, the per-GPU MTBF over the GPU count),
a checkpoint every tau seconds of work taking delta seconds to save, and R seconds to
restart (load the checkpoint, relaunch), the expected wall time per segment of tau work is
(Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart
dumps", FGCS 22, eq. 13; failures may strike during the save and the restart too):
    E[T] = M e^(R/M) (e^((tau + delta)/M) - 1),      goodput = tau / E[T].
Its optimum is about Young's sqrt(2 delta M) (Young 1974, first order in delta/M), more
closely Daly's eq. 37: sqrt(2 delta M) [1 + sqrt(delta/(2M))/3 + delta/(18 M)] - delta
(delta < 2M; else M). `simulate_long_run` replays such a run event by event (SimPy, a
failure process interrupting the job), which checks the closed form (tests).

Checkpoint size: every parameter's weight and optimizer state, written once (Megatron's
distributed checkpoint saves each shard from one rank): Psi (w + K) bytes, with w and K
from schedules.memory_model.precision_bytes (16-bit weights and K = 12 for mixed-precision
Adam). Save and load at the storage bandwidth per GPU times the GPUs.
Defaults, from Llama 3's 405B run on 16,384 H100s (Dubey et al. 2024): 419 unexpected
interruptions in 54 days (section 3.3.4), so a per-GPU MTBF of 54 x 24 x 16,384 / 419 =
50,677 hours; Tectonic's 2 TB/s sustained (section 3.3.1) over its 16,384 GPUs, 122 MB/s
per GPU. The relaunch overhead (scheduling, process start, NCCL set-up) has no published
figure there: 0 s unless given. Units: seconds, bytes.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import simpy

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.memory_model import precision_bytes

LLAMA3_GPUS, LLAMA3_DAYS, LLAMA3_INTERRUPTIONS = 16_384, 54, 419
GPU_MTBF_HOURS = LLAMA3_DAYS * 24 * LLAMA3_GPUS / LLAMA3_INTERRUPTIONS
CHECKPOINT_GBPS = 2e3 / LLAMA3_GPUS  # GB/s per GPU: Tectonic's 2 TB/s sustained


@dataclass(frozen=True)
class Resilience:
    """The failure and checkpoint settings of a run (module docstring for the defaults)."""

    gpu_mtbf_hours: float = GPU_MTBF_HOURS
    checkpoint_gbps: float = CHECKPOINT_GBPS  # GB/s per GPU, write and read
    restart_overhead_s: float = 0.0
    checkpoint_every: int | None = None  # iterations; None: Daly's optimum

    def __post_init__(self) -> None:
        for name in ("gpu_mtbf_hours", "checkpoint_gbps"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be > 0")
        if not self.restart_overhead_s >= 0:
            raise ConfigError(f"restart_overhead_s={self.restart_overhead_s} must be >= 0")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint_every={self.checkpoint_every} must be a whole "
                              f"number of iterations >= 1")


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum checkpoint interval, sqrt(2 delta M), seconds."""
    return math.sqrt(2 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (2006, eq. 37), seconds of work between checkpoints."""
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = save_s / (2 * mtbf_s)
    return young_interval(save_s, mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


def expected_goodput(interval_s: float, save_s: float, restart_s: float,
                     mtbf_s: float) -> float:
    """Useful work over expected wall time, Daly's eq. 13 (module docstring)."""
    wall = mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + save_s) / mtbf_s)
    return interval_s / wall


@dataclass(frozen=True)
class LongRun:
    """One replayed run: its wall time, failures, and work lost to them (seconds)."""

    work_s: float
    wall_s: float
    failures: int
    lost_s: float

    @property
    def goodput(self) -> float:
        return self.work_s / self.wall_s


def simulate_long_run(segments: int, interval_s: float, save_s: float, restart_s: float,
                      mtbf_s: float, seed: int = 0) -> LongRun:
    """Replay `segments` checkpoint intervals of `interval_s` work, each followed by a
    save of `save_s`, under failures at exponential intervals of mean `mtbf_s` (one RNG
    seeded by `seed`): a failure interrupts the work, the save or a restart; the job then
    restarts (`restart_s`) and redoes the segment."""
    env, rng = simpy.Environment(), random.Random(seed)
    tally = {"failures": 0, "lost": 0.0}

    def job():
        for _ in range(segments):
            while True:
                start = env.now
                try:
                    yield env.timeout(interval_s + save_s)
                    break
                except simpy.Interrupt:
                    tally["lost"] += env.now - start
                    yield from restart()

    def restart():
        while True:
            try:
                yield env.timeout(restart_s)
                return
            except simpy.Interrupt:
                continue

    def failures(proc):
        while proc.is_alive:
            yield env.timeout(rng.expovariate(1 / mtbf_s))
            if proc.is_alive:
                tally["failures"] += 1
                proc.interrupt()

    running = env.process(job())
    env.process(failures(running))
    env.run(until=running)
    return LongRun(segments * interval_s, env.now, tally["failures"], tally["lost"])


@dataclass(frozen=True)
class CheckpointPlan:
    """The checkpoint cadence of a run and its expected goodput (module docstring)."""

    settings: Resilience
    params: float
    bytes_per_param: int
    gpus: int
    iteration_s: float

    @property
    def checkpoint_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def bandwidth(self) -> float:
        """Bytes/s the whole job writes or reads a checkpoint at."""
        return self.gpus * self.settings.checkpoint_gbps * 1e9

    @property
    def save_s(self) -> float:
        return self.checkpoint_bytes / self.bandwidth

    @property
    def restart_s(self) -> float:
        """Loading the checkpoint (at the save bandwidth) plus the relaunch overhead."""
        return self.save_s + self.settings.restart_overhead_s

    @property
    def mtbf_s(self) -> float:
        return self.settings.gpu_mtbf_hours * 3600 / self.gpus

    @property
    def every(self) -> int:
        """Iterations between checkpoints: the given ones, or Daly's optimum rounded."""
        if self.settings.checkpoint_every is not None:
            return self.settings.checkpoint_every
        return max(1, round(daly_interval(self.save_s, self.mtbf_s) / self.iteration_s))

    @property
    def interval_s(self) -> float:
        return self.every * self.iteration_s

    @property
    def goodput(self) -> float:
        return expected_goodput(self.interval_s, self.save_s, self.restart_s, self.mtbf_s)

    def lines(self) -> list[str]:
        s, gpus = self.settings, self.gpus
        source = ("" if s.checkpoint_gbps != CHECKPOINT_GBPS else
                  ": Llama 3's 2 TB/s over 16,384 GPUs")
        mtbf_source = ("" if s.gpu_mtbf_hours != GPU_MTBF_HOURS else
                       " (Llama 3: 419 interruptions in 54 days on 16,384 GPUs)")
        chosen = ("given" if s.checkpoint_every is not None else "Daly's optimum, rounded")
        return [
            f"checkpoint: {self.checkpoint_bytes / 1e12:.3g} TB = {self.params:.4g} "
            f"parameters x {self.bytes_per_param} B (weights and optimizer state, ZeRO's "
            f"w + K); save {self.save_s:.3g} s at {self.bandwidth / 1e9:.4g} GB/s ({gpus:,} "
            f"GPUs x {s.checkpoint_gbps * 1e3:.4g} MB/s{source})",
            f"failures: job MTBF {self.mtbf_s / 3600:.4g} h = {s.gpu_mtbf_hours:,.0f} "
            f"GPU-hours / {gpus:,} GPUs{mtbf_source}; each restarts the whole job from its "
            f"last checkpoint in {self.restart_s:.3g} s (load {self.save_s:.3g} s + "
            f"relaunch {s.restart_overhead_s:.3g} s{'' if s.restart_overhead_s else ', assumed'})",
            f"checkpoint every {self.every:,} iterations = {self.interval_s:,.4g} s of work "
            f"({chosen}; Daly 2006 eq. 37: {daly_interval(self.save_s, self.mtbf_s):,.4g} s, "
            f"Young's sqrt(2 x save x MTBF): {young_interval(self.save_s, self.mtbf_s):,.4g} s)",
            f"expected goodput {self.goodput:.2%} (useful work / wall time, Daly 2006 eq. 13: "
            f"failures during saves and restarts included)"]

    def to_dict(self) -> dict:
        return {"checkpoint_bytes": self.checkpoint_bytes, "save_s": self.save_s,
                "restart_s": self.restart_s, "job_mtbf_s": self.mtbf_s,
                "checkpoint_every_iterations": self.every,
                "checkpoint_interval_s": self.interval_s,
                "daly_interval_s": daly_interval(self.save_s, self.mtbf_s),
                "young_interval_s": young_interval(self.save_s, self.mtbf_s),
                "goodput": self.goodput}


def plan_checkpoints(settings: Resilience, model, gpus: int, iteration_s: float
                     ) -> CheckpointPlan:
    """The checkpoint plan of a `gpus`-GPU run of `model` whose iteration takes
    `iteration_s` seconds."""
    if model.lora:
        raise ConfigError("checkpoints of LoRA runs (adapters and their optimizer state, "
                          "the frozen base not rewritten) are not modelled")
    weight, k = precision_bytes(model.dtype)
    return CheckpointPlan(settings, model.param_count(), weight + k, gpus, iteration_s)
