"""Compute time on a device: seconds for one compute op (the roofline cost model's part,
sim.cost_model).

- `RooflineCost`: time = max(work / (peak * compute fraction), bytes / (HBM bandwidth *
  memory fraction)) — the roofline model (Williams, Waterman & Patterson, CACM 2009) with
  achievable fractions of the datasheet peaks — applied to each kernel of an op and
  summed (`kernels_time`; the kernels of F/B/I/W come from schedules.layer_kernels via
  `StageKernelCost`), or to the op as a whole when it has no kernel list. A GEMM kernel's
  compute term comes from `gemm_seconds` (measured GEMM times) where it has a measurement,
  a flash-attention kernel's from `attention_seconds` (measured attention times) likewise.
  Otherwise a flash-attention kernel's compute term runs at its backend's published speed
  on the device at its sequence length (topologies.attention_kernels; forward and backward
  apart) where one was found, else at the matmul ceiling (a run note says so). On devices whose
  GEMMs write their output after the K loop (Ampere, Hopper: DeviceSpec.matmul_best_k) a
  GEMM also pays that write (`gemm_seconds_at_ceiling`): shallow GEMMs (small K) run
  below the ceiling.

The fractions (`compute_fraction`, `memory_fraction`). By default, the device's measured
ceilings times one attainment factor: a GEMM reaches its device's maximum achievable
matmul FLOP/s for its dtype (DeviceSpec.matmul_ceiling: S. Bekman's MAMF table, per device
and dtype, with its source) and a memory-bound kernel its best measured HBM bandwidth
(DeviceSpec.hbm_ceiling), each times ATTAINMENT: kernels inside a training layer run below
their best-case ceilings (launch gaps, wave tails, dropout's random numbers). ATTAINMENT is
the one factor at which the simulated 22B layer of K22 Table 4 (Megatron on Selene A100s:
h 6144, t 8, micro-batch 4, s 2048, no recompute; 19.6 ms forward + backward, two layers
minus one) takes the measured time; benchmarks/fidelity.py (`k22_layer_attainment`)
derives it by bisection and tests/test_fidelity.py checks that this constant is what it
gives. One published micro-measurement, never a row of a fidelity table. A device
without a measured ceiling for a dtype is refused (give --compute-efficiency /
--memory-efficiency); explicit efficiencies replace the ceilings x attainment for every
device and dtype.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from clustersim.schedules.annotate import work_costs
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.ep_comms import PAIR_COMM_SMS, pair_hides_experts
from clustersim.schedules.intra_layer import TP_OVERLAP_COMM_SMS, sm_margin_gemms
from clustersim.schedules.layer_kernels import FP8_GEMMS, Kernel
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.plan import Plan
from clustersim.topologies import DeviceSpec
from clustersim.topologies.attention_kernels import BACKENDS, attention_curve, resolve_backend

ATTAINMENT = 0.8729  # module docstring: K22 Table 4's 22B layer (benchmarks/fidelity.py)


def check_fraction(name: str, value: float | None) -> None:
    if value is not None and not 0 < value <= 1:
        raise ConfigError(f"{name} must be in (0, 1], got {value}")


def compute_fraction(device: DeviceSpec, dtype: str, compute_efficiency: float | None = None,
                     attainment: float = ATTAINMENT) -> float:
    """The fraction of `device`'s dense `dtype` peak a GEMM reaches: `compute_efficiency`
    when given, else the device's measured matmul ceiling x `attainment`."""
    if compute_efficiency is not None:
        return compute_efficiency
    ceiling = device.matmul_ceiling_of(dtype)
    if ceiling is None and assumed_ceiling(device, dtype):
        ceiling = device.matmul_ceiling_of("bf16")
    if ceiling is None:
        raise ConfigError(f"device {device.name!r} has no measured matmul ceiling for "
                          f"{dtype}: give --compute-efficiency (a fraction of its peak)")
    return ceiling * attainment


def assumed_ceiling(device: DeviceSpec, dtype: str) -> str | None:
    """The note when `dtype`'s GEMMs take the device's bf16 ceiling fraction for lack of
    a measurement of their own (fp32, which runs on TF32 tensor cores: no published
    maximum-achievable TF32 matmul), else None."""
    if (device.peak_flops.get("fp32") and dtype in ("fp32", "tf32")
            and device.matmul_ceiling_of(dtype) is None
            and device.matmul_ceiling_of("bf16") is not None):
        return (f"assumed: {device.name} fp32 (TF32) GEMMs reach the same fraction of their "
                f"peak as its measured bf16 ones (no published TF32 matmul ceiling)")
    return None


def sm_sharing_slowdown(sm_count: int, comm_sms: int) -> float:
    """f such that compute on the SMs that communication kernels holding `comm_sms` of a
    GPU's `sm_count` leave takes 1 + f = sm_count / (sm_count - comm_sms) times as long:
    f = comm_sms / (sm_count - comm_sms) (TP overlap here; DP collectives,
    sim.collective_model.overlap_slowdown)."""
    if sm_count <= comm_sms:
        raise ConfigError(f"a device with {sm_count} SMs cannot give {comm_sms} of them to a "
                          f"collective and keep computing")
    return comm_sms / (sm_count - comm_sms)


def memory_fraction(device: DeviceSpec, memory_efficiency: float | None = None,
                    attainment: float = ATTAINMENT) -> float:
    """The fraction of `device`'s HBM bandwidth a memory-bound kernel reaches:
    `memory_efficiency` when given, else its measured HBM ceiling x `attainment`."""
    if memory_efficiency is not None:
        return memory_efficiency
    if device.hbm_ceiling is None:
        raise ConfigError(f"device {device.name!r} has no measured HBM ceiling: give "
                          f"--memory-efficiency (a fraction of its HBM bandwidth)")
    return device.hbm_ceiling * attainment


def check_attention_backend(backend: str, compute_efficiency: float | None) -> None:
    """Refuse an unknown --attention-backend, or one that explicit efficiencies (which
    replace every published ceiling) would ignore."""
    if backend not in BACKENDS:
        raise ConfigError(f"attention_backend must be one of {', '.join(BACKENDS)}, "
                          f"got {backend!r}")
    if backend != "auto" and compute_efficiency is not None:
        raise ConfigError(f"--attention-backend {backend} picks a published attention speed; "
                          f"--compute-efficiency replaces every ceiling, so it would change "
                          f"nothing: give one of them")


def attention_note(device: DeviceSpec, backend: str) -> str | None:
    """The note when `device` has no published speed for `backend` ('auto': the one Transformer
    Engine would pick) and flash attention runs at the matmul ceiling instead, else None.
    An explicit backend without a measurement is refused (ConfigError)."""
    if attention_curve(device.name, backend) is not None:
        return None
    chosen = resolve_backend(device.name, backend)
    if backend != "auto":
        raise ConfigError(f"--attention-backend {backend}: no published speed of {chosen} "
                          f"attention on {device.name} (topologies.attention_kernels)")
    return (f"assumed: flash attention on {device.name} at the matmul ceiling (no published "
            f"speed of its {chosen} attention kernels)")


OUTPUT_BYTES = {"fp32": 4}
"""Bytes of a GEMM output element per model dtype: 2 (16-bit; an FP8 GEMM writes 16 bit,
schedules.layer_kernels.FP8_GEMMS) but for fp32 models."""


def gemm_seconds_at_ceiling(device: DeviceSpec, dtype: str, kernel: Kernel,
                            output_bytes: float) -> float | None:
    """Seconds of a GEMM kernel at `device`'s measured ceilings where its output write is
    exposed (DeviceSpec.matmul_best_shape), else None (the flat ceiling). Its K loop runs at
    R and overlaps the input reads; the output, M*N*`output_bytes`, is written after it at
    the HBM ceiling B; every GEMM takes the device's floor t0 on top (gemm_floor_s):
    t = max(work / R, input bytes / B) + output bytes / B + t0. R follows from the matmul
    ceiling C measured at shape (M*, N*, K*), which took 2M*N*K*/C = 2M*N*K*/R + M*N*b/B +
    t0. No GEMM beats C, the best of every shape the measurement swept (a deeper K would
    by this law alone). A kernel that sums n GEMMs of one shape (layer_kernels.merge) pays
    n writes and n floors. Checked against published H100 GEMM times (tests/test_gemm_shapes.py)."""
    best = device.best_shape_of(dtype)
    if best is None:
        return None
    bandwidth, floor = device.achievable_hbm_bandwidth, device.gemm_floor_s
    best_m, best_n, best_k = best
    best_flops = 2 * best_m * best_n * best_k
    k_loop_seconds = (best_flops / device.achievable_flops(dtype)
                      - best_m * best_n * output_bytes / bandwidth - floor)
    m, n, k = kernel.gemm
    gemms = kernel.flops / (2 * m * n * k)
    written = gemms * m * n * output_bytes
    law = (max(kernel.executed * k_loop_seconds / best_flops,
               (kernel.nbytes - written) / bandwidth)
           + written / bandwidth + gemms * floor)
    return max(law, kernel.executed / device.achievable_flops(dtype))


GemmSeconds = Callable[[Kernel, str], "float | None"]
"""(GEMM kernel, dtype) -> its measured seconds, or None where there is no measurement
(a table of GEMM times, issue 16 item 2); the roofline prices the rest."""
AttentionSeconds = GemmSeconds
"""(flash-attention kernel, dtype) -> its measured seconds, or None (sim.attention_table);
the published curve or the roofline prices the rest."""


@dataclass(frozen=True)
class RooflineCost:
    """Rooflines on one device (module docstring); efficiencies None = the device's
    measured ceilings x `attainment`."""

    device: DeviceSpec
    dtype: str = "bf16"
    compute_efficiency: float | None = None
    memory_efficiency: float | None = None
    gemm_seconds: GemmSeconds | None = None
    attention_seconds: AttentionSeconds | None = None
    attainment: float = ATTAINMENT
    attention_backend: str = "auto"

    def __post_init__(self) -> None:
        check_fraction("compute_efficiency", self.compute_efficiency)
        check_fraction("memory_efficiency", self.memory_efficiency)
        check_fraction("attainment", self.attainment)
        check_attention_backend(self.attention_backend, self.compute_efficiency)
        if self.compute_efficiency is None:
            attention_note(self.device, self.attention_backend)  # refuses a missing one
        object.__setattr__(self, "_attention", None if self.compute_efficiency is not None
                           else attention_curve(self.device.name, self.attention_backend))
        for dtype in {self.dtype, "bf16"}:  # fail early on a dtype or ceiling it lacks
            self._flops_per_second(dtype)
        object.__setattr__(self, "_bandwidth", self.device.hbm_bandwidth * memory_fraction(
            self.device, self.memory_efficiency, self.attainment))
        object.__setattr__(self, "_ceilings_apply", self.compute_efficiency is None
                           and self.memory_efficiency is None)

    def _flops_per_second(self, dtype: str) -> float:
        return self.device.peak(dtype) * compute_fraction(
            self.device, dtype, self.compute_efficiency, self.attainment)

    def time(self, flops: float, nbytes: float, dtype: str | None = None) -> float:
        """Roofline seconds of `flops` at the achievable rate of `dtype` (default: the
        model's) and `nbytes` at the achievable HBM bandwidth."""
        compute = flops / self._flops_per_second(dtype or self.dtype) if flops else 0.0
        return max(compute, nbytes / self._bandwidth)

    def kernels_time(self, kernels: Iterable[Kernel], fewer_sms: frozenset[str] = frozenset(),
                     comm_sms: int = 0) -> float:
        """Kernels run one after another: the sum of their rooflines. Under 'fp8' only
        Transformer Engine's FP8 GEMMs (schedules.layer_kernels.FP8_GEMMS) run at the FP8
        peak; every other kernel at the bf16 one. Kernels named in `fewer_sms` share the
        GPU with communication kernels holding `comm_sms` SMs: their compute term takes
        sm_count / (sm_count - comm_sms) times as long (sm_sharing_slowdown)."""
        slow = 1 + sm_sharing_slowdown(self.device.sm_count, comm_sms)
        total = 0.0
        for k in kernels:
            compute = self._compute_seconds(k)
            total += max(compute * slow if k.name in fewer_sms else compute,
                         self.time(0.0, k.nbytes))
        return total

    def _compute_seconds(self, kernel: Kernel) -> float:
        """A GEMM's or flash-attention kernel's measured time where `gemm_seconds` or
        `attention_seconds` has one, a flash-attention kernel's work at its backend's
        published speed where there is one, else its work at the compute roofline."""
        dtype = self._dtype_of(kernel)
        for measured_seconds, applies in ((self.gemm_seconds, kernel.gemm),
                                          (self.attention_seconds, kernel.attention)):
            if applies is not None and measured_seconds is not None:
                measured = measured_seconds(kernel, dtype)
                if measured is not None:
                    return measured
        if kernel.attention is not None and self._attention is not None:
            seq_length, phase, _ = kernel.attention
            rate = (self.device.peak("bf16") * self.attainment
                    * self._attention.fraction(seq_length, phase))
            return kernel.executed / rate
        if kernel.gemm is not None and self._ceilings_apply:
            at_ceiling = gemm_seconds_at_ceiling(self.device, dtype, kernel,
                                                 OUTPUT_BYTES.get(self.dtype, 2))
            if at_ceiling is not None:
                return at_ceiling / self.attainment
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
    those leave (schedules.intra_layer.sm_margin_gemms); so do all the kernels of an op of
    DualPipe's overlapped pair while its expert all-to-alls hold PAIR_COMM_SMS
    (schedules.ep_comms.pair_hides_experts). Kernel times are cached per (kind, stage,
    layer group, pair), and the kernels' sum once per (kind, pair, roofline, kernels):
    stages with equal kernels on one roofline (a deep pipeline's middle stages, whose
    rooflines sim.cost_model shares per device) share it."""

    def __init__(self, rooflines: Sequence[RooflineCost], plan: Plan):
        self._rooflines, self._plan = rooflines, plan
        self._seconds: dict[tuple, tuple[float, float]] = {}  # key -> (seconds, base FLOPs)
        self._summed: dict[tuple, float] = {}  # (kind, pair, roofline id, kernels) -> s

    def _kernels(self, op: Op) -> tuple[Kernel, ...] | None:
        c = self._plan.costs_of(op.stage, op.chunk)
        if op.kind is OpKind.F:
            return c.forward_kernels
        if op.kind in (OpKind.B, OpKind.I, OpKind.W):
            return c.backward_kernels  # I and W: half of each (_kernels_time)
        return None

    def __call__(self, op: Op) -> float:
        key = (op.kind, op.stage, op.chunk, op.overlapped)
        hit = self._seconds.get(key)
        if hit is None:
            kernels = self._kernels(op)
            roofline = self._rooflines[op.stage]
            if kernels is None:
                return roofline(op)
            base = work_costs(op.kind, self._plan.costs_of(op.stage, op.chunk))[0]
            summed = (op.kind, op.overlapped, id(roofline), kernels)  # rooflines: held
            seconds = self._summed.get(summed)
            if seconds is None:
                seconds = self._summed[summed] = self._kernels_time(op, kernels, roofline)
            hit = self._seconds[key] = (seconds, base)
        seconds, base = hit
        if op.flops > base:  # imbalanced experts (class docstring)
            seconds += self._rooflines[op.stage].time(op.flops - base, 0.0)
        return seconds

    def _kernels_time(self, op: Op, kernels: tuple[Kernel, ...],
                      roofline: RooflineCost) -> float:
        plan = self._plan
        if op.kind in (OpKind.I, OpKind.W):
            kernels = tuple(k.scaled(0.5) for k in kernels)
        if op.overlapped and pair_hides_experts(plan.model, plan.parallel):
            # DualPipe's pair: every kernel on the SMs left
            slowed, sms = frozenset(k.name for k in kernels), PAIR_COMM_SMS
        else:
            slowed = sm_margin_gemms(plan.parallel, plan.model, op.kind)
            sms = TP_OVERLAP_COMM_SMS
        return roofline.kernels_time(kernels, slowed, sms)
