"""The planner's search space: every layout of a model on N GPUs that the simulator can
replay, as plain data (no checks here; sim.planner.layouts checks them).

A `Layout` is one point: tensor (tp), pipeline (pp), data (dp), context (cp) and expert
(ep, MoE models only) parallel degrees with tp * pp * dp * cp = N, virtual stages per
pipeline rank (vpp), micro-batch size, ZeRO stage (0: DDP; 1: Megatron's distributed
optimizer; 2; 3: FSDP / ZeRO-3), activation recompute, sequence parallelism, pipeline
schedule and rank order (the rank placement: Megatron's `tp-cp-ep-dp-pp`, or pipeline
neighbours adjacent, `tp-cp-ep-pp-dp`).

Schedules: the registry's (schedules.registry) that replay one flushed iteration of one
stage chain with a fixed order: not those built from a run's costs (zb-auto), the
asynchronous ones (PipeDream, 2BW: their iteration is a steady-state window) or
bidirectional DualPipe (two chains). With pp = 1 every schedule runs the same programs,
so only one is enumerated there: 1f1b, or where the space leaves it out, the first of its
schedules that runs one stage per rank.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import RECOMPUTE, ParallelConfig
from clustersim.schedules.registry import SCHEDULES, ScheduleEntry

MEGATRON_ORDER = "tp-cp-ep-dp-pp"
PIPELINE_INNER_ORDER = "tp-cp-ep-pp-dp"
ZERO_NAMES = {0: "ddp", 1: "zero1 (dist. optimizer)", 2: "zero2", 3: "zero3 (fsdp)"}


def plannable(entry: ScheduleEntry) -> bool:
    """Whether the planner enumerates a registered schedule (module docstring)."""
    return not entry.built_from_costs and entry.stashing is None and entry.chains == 1


PLANNABLE_SCHEDULES = tuple(name for name, e in SCHEDULES.items() if plannable(e))


@dataclass(frozen=True, order=True)
class Layout:
    """One candidate layout (module docstring)."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    micro_batch_size: int
    zero: int
    recompute: str
    schedule: str
    sequence_parallel: bool
    rank_order: str = MEGATRON_ORDER

    def parallel(self, global_batch_size: int) -> ParallelConfig:
        """The ParallelConfig of this layout (raises ConfigError where it is invalid)."""
        return ParallelConfig(
            tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep, vpp=self.vpp,
            micro_batch_size=self.micro_batch_size, zero_stage=self.zero,
            recompute=self.recompute, schedule=self.schedule,
            sequence_parallel=self.sequence_parallel, rank_order=self.rank_order,
            global_batch_size=global_batch_size)

    def cost_key(self) -> tuple:
        """The fields a plan's stage costs, split and groups depend on: layouts that
        differ only in ZeRO stage or in a schedule of the same virtual stages share them."""
        return (self.tp, self.pp, self.dp, self.cp, self.ep, self.vpp, self.micro_batch_size,
                self.recompute, self.sequence_parallel, self.rank_order,
                SCHEDULES[self.schedule].placement)

    def describe(self) -> str:
        """A short label: 'tp8 pp4 dp32 vpp3 mbs2 1f1b zero1 sel sp'."""
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"vpp{self.vpp}"] if self.vpp > 1 else []
        parts += [f"mbs{self.micro_batch_size}", self.schedule, f"zero{self.zero}",
                  self.recompute] + (["sp"] if self.sequence_parallel else [])
        parts += ["pp-inner"] if self.rank_order != MEGATRON_ORDER else []
        return " ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SearchSpace:
    """The choices enumerated per dimension; None = derived from the model and GPU count
    (`enumerate_layouts`)."""

    tp: Sequence[int] | None = None  # default: powers of two up to the GPUs of a node
    pp: Sequence[int] | None = None  # default: divisors of N / (tp*cp) up to num_layers
    cp: Sequence[int] | None = None  # default: 1, and 2 for sequences >= 4096 tokens
    ep: Sequence[int] | None = None  # default: divisors of num_experts (MoE only)
    micro_batch_size: Sequence[int] = (1, 2, 4, 8)
    zero: Sequence[int] = (0, 1, 2, 3)
    recompute: Sequence[str] = RECOMPUTE
    schedules: Sequence[str] = PLANNABLE_SCHEDULES
    max_vpp: int = 4  # virtual stages per rank tried by the interleaved schedules
    rank_orders: Sequence[str] = (MEGATRON_ORDER,)
    sequence_parallel: Sequence[bool] = field(default=(False, True))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _vpps(entry: ScheduleEntry, pp: int, layers: int, most: int) -> list[int]:
    """The virtual stages per rank to try: the entry's range, capped at `most`, whose
    pp * vpp stages split the layers evenly (only even splits when vpp > 1)."""
    if pp == 1:
        return [1] if entry.min_vpp == 1 else []
    top = entry.max_vpp if entry.max_vpp is not None else most
    return [v for v in range(entry.min_vpp, min(top, most) + 1)
            if v == 1 or layers % (pp * v) == 0]


def enumerate_layouts(model: ModelSpec, gpus: int, global_batch_size: int,
                      space: SearchSpace = SearchSpace(), max_tp: int = 8
                      ) -> Iterator[Layout]:
    """Every layout of `space` with tp * pp * dp * cp = `gpus` whose micro-batches divide
    the global batch (module docstring); nothing else is checked here. By default tp is
    a power of two up to `max_tp` (the GPUs of a node: tensor parallelism inside the
    NVLink domain, as Megatron-LM lays it out; sim.planner.bound prices only the
    collectives of groups on one host)."""
    tps = space.tp or [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= max_tp and gpus % t == 0]
    cps = space.cp or ([1, 2] if model.seq_length >= 4096 else [1])
    for tp in tps:
        for cp in cps:
            if gpus % (tp * cp):
                continue
            pps = space.pp or [p for p in _divisors(gpus // (tp * cp))
                               if p <= model.num_layers]
            for pp in pps:
                if (gpus // (tp * cp)) % pp:
                    continue
                dp = gpus // (tp * cp * pp)
                yield from _at_degrees(model, global_batch_size, space, tp, pp, dp, cp)


def _at_degrees(model: ModelSpec, global_batch_size: int, space: SearchSpace, tp: int,
                pp: int, dp: int, cp: int) -> Iterator[Layout]:
    eps = ([e for e in (space.ep or _divisors(model.num_experts)) if (dp * cp) % e == 0]
           if model.is_moe else [1])
    schedules = [s for s in space.schedules if s in SCHEDULES]
    if pp == 1:  # one stage: every schedule runs the same programs (module docstring)
        flat = [s for s in schedules if SCHEDULES[s].min_vpp == 1]
        schedules = ["1f1b"] if "1f1b" in flat else flat[:1]
    for mbs in space.micro_batch_size:
        if global_batch_size % (mbs * dp):
            continue
        for name in schedules:
            for vpp in _vpps(SCHEDULES[name], pp, model.num_layers, space.max_vpp):
                for ep in eps:
                    for zero in space.zero if dp * cp > 1 else (0,):  # nothing to shard
                        for recompute in space.recompute:
                            for sp in space.sequence_parallel if tp > 1 else (False,):
                                for order in space.rank_orders:
                                    yield Layout(tp, pp, dp, cp, ep, vpp, mbs, zero,
                                                 recompute, name, sp, order)
