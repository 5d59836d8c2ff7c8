"""ParallelConfig: how one training iteration is split over ranks (Megatron-LM semantics).

Grid: world_size = tp * cp * dp * pp ranks. Expert parallelism does not add ranks: as in
Megatron-Core (`parallel_state.initialize_model_parallel`, two `RankGenerator`s), the
tp * cp * dp ranks of one pipeline stage are split a second time for the MoE experts, into
etp x ep x edp: expert tensor parallel (`expert_tensor_parallel`, Megatron-Core's
--expert-tensor-parallel-size, default tp), expert parallel and expert data parallel
edp = tp * cp * dp / (etp * ep); so etp * ep must divide tp * cp * dp (with etp = tp: ep
divides dp * cp). Rank order follows Megatron's `--order` string, first name innermost:
with the default 'tp-cp-ep-dp-pp', TP neighbours have consecutive ranks and pipeline
stages are farthest apart. The dense grid uses every axis but ep; the expert grid uses
etp (in the 'tp' place), ep, edp (in the 'dp' place) and pp in the same order, cp = 1.
Group axes (`group`): the dense tp, cp, dp, pp, dp_cp (the dp x cp ranks of one tp and pp
coordinate: Megatron-Core's data-parallel group with context parallel, over which dense
gradients reduce) and the expert ep, etp, edp.

Pipeline split (schedules.pipeline_split): even by default; `first_stage_layers` /
`last_stage_layers` (Megatron-Core's --decoder-first/last-pipeline-num-layers) or
`account_for_embedding` / `account_for_loss` (--account-for-embedding/loss-in-pipeline-
split) make the first and last stages lighter.

ZeRO-Infinity's NVMe tier (Rajbhandari et al., "ZeRO-Infinity", SC21): `offload_device`
(DeepSpeed's offload_optimizer.device; None = 'cpu', host memory; either given needs
offload) 'nvme' keeps the offloaded optimizer states on the node's NVMe instead of host
memory (`nvme_offload`), which needs ZeRO-3: DeepSpeed swaps them
only in its ZeRO-3 optimizer (runtime/zero/stage3.py `_configure_offloading`: swap_optimizer
when device is 'nvme'; stage_1_and_2.py offloads to the CPU for any device but 'none').
`nvme_bandwidth` (bytes/s of the node's NVMe, read and write alike, shared by its ranks;
no datasheet here gives it, so the user does) prices the swaps (sim.optimizer_cost) and
needs offload_device 'nvme'.

`activation_memory_limit`: the activation bytes a pipeline rank may hold, the cap under
which the zb-auto schedule is built (sim.auto_schedule; default: the device's memory left
after everything else); only with that schedule.

ZeRO-R's partitioned activation checkpoints: `partition_activations` (DeepSpeed's
activation_checkpointing.partition_activations, Megatron's --distribute-saved-activations)
and `cpu_checkpointing`; their rules and costs are schedules.activation_partition's.

Intra-layer options (schedules.intra_layer; Megatron names where Megatron has the flag):
`tp_comm_overlap` (--tp-comm-overlap), `cp_comm` ('ring' | 'ulysses' | 'usp'; Megatron-
Core's --cp-comm-type p2p | a2a | a2a+p2p) with `cp_a2a` for 'usp' (the first of
Megatron-Core's --hierarchical-context-parallel-sizes), `moe_imbalance` (busiest expert's
tokens over the balanced share, >= 1; no Megatron flag) and `scatter_gather` (SC21's
scatter/gather of pipeline transfers; Megatron's scatter_gather_tensors_in_pipeline).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from clustersim.user_files import is_finite_number

from .activation_partition import check as check_partition_activations
from .errors import ConfigError, require_positive_int
from .fp8 import check_fp8_param_gather
from .lora import check_lora_layout
from .usp import check_usp_sizes, usp_group
from .single_process_dp import check_single_process
from .tp_grid import check_model_grid, check_tp_mode
from .weight_stashing import check_stashed_layout
from .names import CP, CP_A2A, CP_RING, DP, DP_CP, EDP, EP, EXPERT_AXES, GRID_AXES, PP, TP
from .limits import check_dimension
from .recompute import normalised_options
from .registry import DEFAULT_SCHEDULE, schedule_entry
from .parallel_aliases import ALIASES, resolve_kwargs
from .sharding import DEFAULT_BUCKET_BYTES, normalised_sharding

__all__ = ["ALIASES", "CP_COMM", "CUSTOM_SCHEDULE", "EXPERT_AXES", "FSDP", "OFFLOAD_DEVICES",
           "RECOMPUTE", "ParallelConfig", "check_moe_imbalance"]

RECOMPUTE = ("none", "selective", "full")
FSDP = ("none", "full", "hybrid")
CP_COMM = ("ring", "ulysses", "usp")  # schedules.cp_comms
OFFLOAD_DEVICES = ("cpu", "nvme")  # where offloaded optimizer states live (module docstring)
MIN_NVME = 1e6  # bytes/s: a node's NVMe below 1 MB/s is a unit mistake (GB/s given as B/s)

CUSTOM_SCHEDULE = "custom"


def check_moe_imbalance(factor: Any) -> float:
    """`moe_imbalance` as a float, or ConfigError unless it is a number >= 1."""
    if not is_finite_number(factor) or not factor >= 1:
        raise ConfigError(f"moe_imbalance must be a finite number >= 1 (the busiest expert's "
                          f"tokens over the balanced share), got {factor!r}")
    return float(factor)


@dataclass(frozen=True)
class ParallelConfig:
    """Parallel degrees, batch split, recompute and pipeline schedule of one run.

    `num_microbatches` M per pipeline: given, or global_batch_size / (micro_batch_size*dp),
    or pp by default; __post_init__ fills both M and global_batch_size in. The sharding
    fields are put in one canonical form and checked by schedules.sharding (fsdp='full'
    is zero_stage=3; ZeRO-2/3 with pp > 1 as Megatron-FSDP and torchtitan run them;
    ZeRO++ and offload need their stages).
    `expert_tensor_parallel` stays None when not given; `etp` reads it resolved (= tp).
    The intra-layer fields are read by schedules.intra_layer and `overlapped_groups`
    (module docstring).
    """

    pp: int = 1
    vpp: int | None = None  # virtual stages per rank; None = the schedule's default
    dp: int = 1
    tp: int = 1
    cp: int = 1
    ep: int = 1
    expert_tensor_parallel: int | None = None  # etp; None = tp (Megatron-Core's default)
    sequence_parallel: bool = False
    zero_stage: int = 0
    num_microbatches: int | None = None
    global_batch_size: int | None = None
    micro_batch_size: int = 1
    recompute: str = "none"
    recompute_method: str | None = None  # full: 'uniform' (default) or 'block'
    recompute_num_layers: int | None = None  # full: layers per checkpoint / checkpointed
    # ZeRO-R (schedules.activation_partition): checkpoints split over tp, optionally on host
    partition_activations: bool = False  # Pa: each TP rank keeps 1/tp of a checkpoint
    cpu_checkpointing: bool = False  # Pa+cpu: the partitions live in host memory
    # data-parallel sharding and its communication (issue 5); see schedules.data_parallel
    dp_impl: str = "ddp"  # 'ddp' (one process per GPU) or 'dataparallel' (torch.nn.DataParallel)
    fsdp: str = "none"  # 'none', 'full' (= ZeRO-3 over dp) or 'hybrid' (shard in a node)
    shard_size: int | None = None  # hybrid shard group size; None = dp ranks per node
    offload: bool = False  # ZeRO-Offload: optimizer state and step on the host
    offload_device: str | None = None  # with offload: 'cpu' (None: the host) or 'nvme'
    nvme_bandwidth: float | None = None  # bytes/s of a node's NVMe (offload_device 'nvme')
    bucket_bytes: int | None = None  # gradient bucket; None = torch DDP's 25 MiB
    overlap_grad_reduce: bool = True  # post bucket reductions during the backward
    overlap_param_gather: bool = False  # ZeRO-1/2: gathers overlap the next forward
    reshard_after_forward: bool = True  # ZeRO-3/FSDP: free gathered params after F
    quantized_weights: bool = False  # ZeRO++ qwZ: int8 weight all-gather
    hpz: bool = False  # ZeRO++ hpZ: secondary parameter shard inside the node
    quantized_gradients: bool = False  # ZeRO++ qgZ: int4 gradient reduce-scatter
    hpz_partition_size: int | None = None  # hpZ secondary shard size; None = dp ranks per node
    rank_order: str = "tp-cp-ep-dp-pp"
    # uneven pipeline split (schedules.pipeline_split; Megatron-Core's flags)
    first_stage_layers: int | None = None  # layers on the first pipeline rank
    last_stage_layers: int | None = None  # layers on the last pipeline rank
    account_for_embedding: bool = False  # the embedding takes one layer's slot
    account_for_loss: bool = False  # the output layer + loss take one layer's slot
    schedule: str = DEFAULT_SCHEDULE  # or CUSTOM_SCHEDULE for a schedule given as data
    activation_memory_limit: float | None = None  # bytes per rank, for zb-auto's search
    # intra-layer communication (issue 6); see schedules.intra_layer
    tp_mode: str = "1d"  # '1d' (Megatron), '2d', '2.5d' or '3d' (schedules.tp_grid)
    tp_depth: int | None = None  # tp_mode '2.5d': the depth d of its q x q x d grid
    tp_comm_overlap: bool = False  # TP collectives run alongside the GEMMs
    cp_comm: str = "ring"  # context parallelism: 'ring', 'ulysses' or 'usp' (both)
    cp_a2a: int | None = None  # USP: the Ulysses ranks of each ring step (cp_comm 'usp')
    moe_imbalance: float = 1.0  # busiest expert's tokens over the balanced share
    scatter_gather: bool = False  # SC21 scatter/gather of pipeline transfers over TP

    def __post_init__(self) -> None:
        if self.vpp is None:  # a schedule given as data has one stage per rank unless it says
            entry = None if self.schedule == CUSTOM_SCHEDULE else schedule_entry(self.schedule)
            object.__setattr__(self, "vpp", entry.default_vpp if entry else 1)
        for name in ("pp", "vpp", "dp", "tp", "cp", "ep", "micro_batch_size"):
            require_positive_int(name, getattr(self, name))
            check_dimension(name, getattr(self, name))
        if not isinstance(self.sequence_parallel, bool):
            raise ConfigError(f"sequence_parallel must be a bool, got {self.sequence_parallel!r}")
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ConfigError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.recompute not in RECOMPUTE:
            raise ConfigError(f"recompute={self.recompute!r} must be one of {', '.join(RECOMPUTE)}")
        method, layers = normalised_options(self.recompute, self.recompute_method,
                                            self.recompute_num_layers)
        object.__setattr__(self, "recompute_method", method)
        object.__setattr__(self, "recompute_num_layers", layers)
        if self.fsdp not in FSDP:
            raise ConfigError(f"fsdp={self.fsdp!r} must be one of {', '.join(FSDP)}")
        for name in ("offload", "overlap_grad_reduce", "overlap_param_gather",
                     "reshard_after_forward",
                     "quantized_weights", "hpz", "quantized_gradients", "tp_comm_overlap",
                     "scatter_gather", "account_for_embedding", "account_for_loss",
                     "partition_activations", "cpu_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.cp_comm not in CP_COMM:
            raise ConfigError(f"cp_comm={self.cp_comm!r} must be one of {', '.join(CP_COMM)}")
        self._check_intra_layer_applies()
        check_tp_mode(self)
        check_partition_activations(self)
        object.__setattr__(self, "moe_imbalance", check_moe_imbalance(self.moe_imbalance))
        for name in ("shard_size", "bucket_bytes", "hpz_partition_size",
                     "expert_tensor_parallel", "first_stage_layers", "last_stage_layers"):
            if getattr(self, name) is not None:
                require_positive_int(name, getattr(self, name))
        order = str(self.rank_order).strip().lower().split("-")
        if sorted(order) != sorted(GRID_AXES):
            raise ConfigError(f"rank_order={self.rank_order!r} must be a '-'-separated "
                              f"permutation of {', '.join(GRID_AXES)}")
        object.__setattr__(self, "rank_order", "-".join(order))
        for name, value in normalised_sharding(self).items():  # rules: schedules.sharding
            object.__setattr__(self, name, value)
        self._check_offload_device()
        check_single_process(self)
        self._check_expert_grid()
        self._resolve_microbatches()
        self._check_schedule()

    def _check_intra_layer_applies(self) -> None:
        """Refuse an intra-layer option where its parallelism is off (module docstring)."""
        for name, needs in (("sequence_parallel", "tp > 1"), ("tp_comm_overlap", "tp > 1"),
                            ("scatter_gather", "tp > 1")):
            if getattr(self, name) and self.tp == 1:
                raise ConfigError(f"{name}=True acts on tensor parallelism: it needs {needs}, "
                                  f"got tp=1")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise ConfigError("tp_comm_overlap=True overlaps the sequence-parallel all-gathers "
                              "and reduce-scatters with the GEMMs (Transformer Engine's "
                              "userbuffers): it needs sequence_parallel (Megatron-LM refuses "
                              "--tp-comm-overlap without --sequence-parallel)")
        if self.scatter_gather and self.sequence_parallel:
            raise ConfigError("scatter_gather=True with sequence_parallel: a pipeline transfer "
                              "already is each TP rank's 1/tp sequence shard (SC21's "
                              "scatter/gather applies without sequence parallelism)")
        if self.cp_comm != "ring" and self.cp == 1:
            raise ConfigError(f"cp_comm={self.cp_comm!r} chooses how context parallelism "
                              f"communicates: it needs cp > 1, got cp=1")
        check_usp_sizes(self.cp_comm, self.cp, self.cp_a2a)

    def _check_offload_device(self) -> None:
        """ZeRO-Infinity's NVMe tier and its bandwidth (module docstring)."""
        if self.offload_device is not None and self.offload_device not in OFFLOAD_DEVICES:
            raise ConfigError(f"offload_device={self.offload_device!r} must be one of "
                              f"{', '.join(OFFLOAD_DEVICES)}")
        if self.offload_device is not None and not self.offload:
            raise ConfigError(f"offload_device={self.offload_device!r} places ZeRO-Offload's "
                              f"optimizer states: it needs offload=True")
        nvme = self.nvme_offload
        if nvme and self.zero_stage != 3:
            raise ConfigError(
                f"offload_device='nvme' with zero_stage={self.zero_stage}: DeepSpeed swaps "
                f"optimizer states to NVMe only in its ZeRO-3 optimizer (its ZeRO-1/2 "
                f"optimizer keeps them in host memory for device 'nvme' as for 'cpu'); use "
                f"zero_stage=3, or offload_device='cpu'")
        if self.nvme_bandwidth is None:
            return
        if not is_finite_number(self.nvme_bandwidth) or not self.nvme_bandwidth >= MIN_NVME:
            raise ConfigError(f"nvme_bandwidth must be a finite number of bytes/s >= 1e6 (a "
                              f"node's NVMe; --nvme-bandwidth and nvme_bandwidth_gbps take "
                              f"GB/s), got {self.nvme_bandwidth!r}")
        if not nvme:
            raise ConfigError("nvme_bandwidth (--nvme-bandwidth) prices the NVMe swaps of "
                              "ZeRO-Infinity's optimizer states: it needs offload_device='nvme'")

    def _check_expert_grid(self) -> None:
        if self.expert_tensor_parallel is None:
            if (self.dp * self.cp) % self.ep:
                raise ConfigError(f"ep={self.ep} must divide dp*cp={self.dp}*{self.cp}: expert "
                                  f"parallelism folds into data/context parallelism "
                                  f"(Megatron-LM)")
        elif (self.tp * self.cp * self.dp) % (self.etp * self.ep):
            raise ConfigError(
                f"expert_tensor_parallel*ep={self.etp}*{self.ep} must divide tp*cp*dp="
                f"{self.tp}*{self.cp}*{self.dp}: the expert grid etp x ep x edp re-splits "
                f"the tp*cp*dp ranks of a pipeline stage (Megatron-Core)")

    def _resolve_microbatches(self) -> None:
        m, gbs, per_mb = self.num_microbatches, self.global_batch_size, self.micro_batch_size * self.dp
        if m is not None:
            require_positive_int("num_microbatches", m)
            check_dimension("num_microbatches", m)
        if gbs is not None:
            require_positive_int("global_batch_size", gbs)
            check_dimension("global_batch_size", gbs)
            if gbs % per_mb:
                raise ConfigError(
                    f"global_batch_size={gbs} must be divisible by micro_batch_size*dp="
                    f"{self.micro_batch_size}*{self.dp}={per_mb}")
            if m is not None and m != gbs // per_mb:
                raise ConfigError(
                    f"num_microbatches={m} disagrees with global_batch_size={gbs} / "
                    f"(micro_batch_size*dp={per_mb}) = {gbs // per_mb}")
            m = gbs // per_mb
        m = self.pp if m is None else m
        object.__setattr__(self, "num_microbatches", m)
        object.__setattr__(self, "global_batch_size", m * per_mb)

    def _check_schedule(self) -> None:
        if self.schedule == CUSTOM_SCHEDULE:
            return  # an imported schedule; schedules.validate checks it
        entry = schedule_entry(self.schedule)  # the registry's rules (schedules.registry)
        object.__setattr__(self, "schedule", entry.name)
        entry.check(self.pp, self.num_microbatches, self.vpp)
        if entry.stashing is not None:
            check_stashed_layout(entry.name, self.zero_stage, self.fsdp, self.offload)
        if entry.chains > 1 and (self.zero_stage == 3 or self.offload):
            raise ConfigError(f"schedule {entry.name!r} sums the gradients of each stage's two "
                              f"copies after their data-parallel reduction "
                              f"(schedules.chains); with zero_stage 3 / FSDP or offload the "
                              f"gradients leave the device first: not modelled, got "
                              f"zero_stage={self.zero_stage}, offload={self.offload}")
        limit = self.activation_memory_limit
        if limit is not None and not entry.built_from_costs:
            raise ConfigError(f"activation_memory_limit (--activation-memory-limit) caps the "
                              f"search of a schedule built from costs (zb-auto); schedule "
                              f"{entry.name!r} has a fixed order it would not change")
        if limit is not None and (not is_finite_number(limit) or not limit > 0):
            raise ConfigError(f"activation_memory_limit must be a finite number of bytes > 0, "
                              f"got {limit!r}")

    # --- construction from other frameworks' spellings -----------------------------------
    @classmethod
    def from_kwargs(cls, **kw: Any) -> ParallelConfig:
        """Build from field names or other frameworks' spellings, values translated
        (schedules.parallel_aliases: '--tensor-model-parallel-size', 'zero_optimization.stage',
        sharding_strategy='FULL_SHARD', bucket_cap_mb=25, ...). None counts as not given."""
        return cls(**resolve_kwargs(kw, {f.name for f in fields(cls)}))

    # --- derived sizes -------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """tp * cp * pp * dp (etp * ep * edp re-split tp * cp * dp)."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def etp(self) -> int:
        """Expert tensor-parallel degree: expert_tensor_parallel, or tp when unset."""
        return self.expert_tensor_parallel or self.tp

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: tp * cp * dp / (etp * ep)."""
        return self.tp * self.cp * self.dp // (self.etp * self.ep)

    @property
    def grad_bucket_bytes(self) -> int:
        """Gradient bucket bytes: bucket_bytes, or torch DDP's 25 MiB default."""
        return self.bucket_bytes or DEFAULT_BUCKET_BYTES

    @property
    def nvme_offload(self) -> bool:
        """Whether the offloaded optimizer states live on NVMe (ZeRO-Infinity)."""
        return self.offload_device == "nvme"

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def activations_split(self) -> bool:
        """Whether the activations between a layer's linears are split over the tp ranks
        too: Megatron's sequence parallelism, or a 2D, 2.5D or 3D grid
        (schedules.tp_grid); else they are replicated on every tp rank."""
        return self.sequence_parallel or self.tp_mode != "1d"

    @property
    def grad_replicas(self) -> int:
        """Ranks holding the same dense weights, over which their gradients are summed:
        dp * cp, times tp_depth under 2.5D tensor parallelism (schedules.tp_grid)."""
        return self.dp * self.cp * (self.tp_depth if self.tp_mode == "2.5d" else 1)

    @property
    def overlapped_groups(self) -> frozenset[str]:
        """Intra-layer groups whose collectives run alongside their compute op instead of
        after it (schedules.contract): 'tp' with tp_comm_overlap, 'cp' with ring attention.
        Both backends place and wait for intra-layer ops by this set."""
        return frozenset({TP} if self.tp_comm_overlap else ()) | frozenset(
            {CP} if self.cp_comm == "ring" else {CP_RING} if self.cp_comm == "usp" else ())

    def _sizes(self, expert: bool) -> dict[str, int]:
        if expert:
            return {TP: self.etp, CP: 1, EP: self.ep, DP: self.edp, PP: self.pp}
        return {TP: self.tp, CP: self.cp, EP: 1, DP: self.dp, PP: self.pp}

    def _encode(self, coords: dict[str, int], sizes: dict[str, int]) -> int:
        rank, stride = 0, 1
        for axis in self.rank_order.split("-"):
            c = coords.get(axis, 0)
            if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < sizes[axis]:
                raise ConfigError(f"coordinate {axis}={c!r} out of range 0..{sizes[axis] - 1}")
            rank, stride = rank + c * stride, stride * sizes[axis]
        return rank

    def _decode(self, rank: int, sizes: dict[str, int]) -> dict[str, int]:
        coords = {}
        for axis in self.rank_order.split("-"):
            rank, coords[axis] = divmod(rank, sizes[axis])
        return coords

    # --- rank grid -----------------------------------------------------------------------
    def rank(self, **coords: int) -> int:
        """Global rank of grid coordinates tp, cp, dp, pp (missing ones are 0). An `ep`
        coordinate, being derived from dp and cp, is only checked for consistency."""
        unknown = sorted(set(coords) - set(GRID_AXES))
        if unknown:
            raise ConfigError(f"unknown grid axis {', '.join(unknown)}: axes are "
                              f"{', '.join(GRID_AXES)}")
        ep = coords.pop(EP, None)
        rank = self._encode(coords, self._sizes(expert=False))
        if ep is not None and ep != self.coords(rank)[EP]:
            raise ConfigError(f"ep={ep} does not match the other coordinates (rank {rank} has "
                              f"ep={self.coords(rank)[EP]}): ep folds into dp and cp")
        return rank

    def coords(self, rank: int) -> dict[str, int]:
        """Grid coordinates of `rank`: tp, cp, dp, pp of the dense grid and its ep index."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ConfigError(f"rank={rank!r} out of range 0..{self.world_size - 1}")
        dense = self._decode(rank, self._sizes(expert=False))
        dense[EP] = self._decode(rank, self._sizes(expert=True))[EP]
        return {axis: dense[axis] for axis in self.rank_order.split("-")}

    def group(self, axis: str, rank: int) -> list[int]:
        """Ranks of `rank`'s process group along `axis`, in axis-coordinate order: a dense
        axis (tp, cp, dp, pp), dp_cp (in rank order) or an expert-grid one (ep, etp, edp:
        module docstring)."""
        if axis in (CP_A2A, CP_RING):
            return usp_group(self.group(CP, rank), rank, self.cp_a2a, axis)
        if axis not in GRID_AXES and axis not in EXPERT_AXES and axis != DP_CP:
            raise ConfigError(f"unknown grid axis {axis!r}: axes are "
                              f"{', '.join(dict.fromkeys((*GRID_AXES, DP_CP, *EXPERT_AXES)))}")
        self.coords(rank)  # range check
        if axis == DP_CP:
            return sorted(r for d in self.group(DP, rank) for r in self.group(CP, d))
        sizes = self._sizes(expert=axis in EXPERT_AXES)
        place = EXPERT_AXES.get(axis, axis)
        base = self._decode(rank, sizes)
        return [self._encode({**base, place: i}, sizes) for i in range(sizes[place])]

    def experts_reduce_apart(self, model: Any) -> bool:
        """Whether `model`'s routed experts reduce their gradients over another group than
        its dense weights: an MoE model whose expert data-parallel group (edp) is not the
        dense dp x cp group (ep > 1, or etp != tp). Megatron-Core then keeps the experts'
        gradients and distributed-optimizer shards on 'edp'."""
        return model.is_moe and sorted(self.group(EDP, 0)) != self.group(DP_CP, 0)

    # --- model compatibility -------------------------------------------------------------
    def check_model(self, model: Any) -> None:
        """Raise ConfigError when `model` (a ModelSpec) cannot be split this way, or this
        layout does not model its FP8 parameter gathers or LoRA (the pipeline split is
        checked where it is computed, schedules.plan.resolve)."""
        check_fp8_param_gather(model, self)
        check_lora_layout(model, self.zero_stage)
        check_model_grid(model, self)
        if self.tp_mode == "1d" and model.num_attention_heads % self.tp:
            raise ConfigError(f"num_attention_heads={model.num_attention_heads} is not "
                              f"divisible by tp={self.tp}")
        if self.tp_mode == "1d" and model.num_query_groups % self.tp:
            raise ConfigError(f"num_query_groups={model.num_query_groups} is not divisible "
                              f"by tp={self.tp}")
        if self.cp > 1 and model.seq_length % (2 * self.cp):
            raise ConfigError(f"seq_length={model.seq_length} is not divisible by 2*cp="
                              f"{2 * self.cp} (Megatron splits the sequence into 2*cp chunks)")
        if self.cp > 1 and self.cp_comm in ("ulysses", "usp"):
            a2a = self.cp if self.cp_comm == "ulysses" else self.cp_a2a
            for what, count in (("attention heads", model.num_attention_heads),
                                ("KV groups (num_query_groups)", model.num_query_groups)):
                if (count // self.tp) % a2a:
                    raise ConfigError(
                        f"cp_comm={self.cp_comm!r} splits the {count // self.tp} {what} of a "
                        f"TP rank over {a2a} ranks (Transformer Engine's a2a context "
                        f"parallelism splits Q, K and V by heads): they must be divisible by "
                        f"{'cp' if self.cp_comm == 'ulysses' else 'cp_a2a'}; use "
                        f"cp_comm='ring'")
        if self.sequence_parallel and (model.seq_length // self.cp) % self.tp:
            raise ConfigError(f"sequence_parallel: seq_length/cp={model.seq_length // self.cp} "
                              f"is not divisible by tp={self.tp}")
        if not model.is_moe:
            given = [name for name, value in (
                ("moe_imbalance", self.moe_imbalance != 1),
                ("expert_tensor_parallel", self.expert_tensor_parallel is not None))
                if value]
            if given:
                raise ConfigError(f"{' and '.join(given)}: the model has no experts "
                                  f"(num_experts unset), so it would change nothing")
        if model.is_moe and self.moe_imbalance > model.num_experts / model.moe_router_topk:
            raise ConfigError(
                f"moe_imbalance={self.moe_imbalance} is above num_experts / topk = "
                f"{model.num_experts}/{model.moe_router_topk}: the busiest expert cannot get "
                f"more than every token (the balanced share is topk/num_experts of them)")
        if self.ep > 1 and (model.num_experts is None or model.num_experts % self.ep):
            raise ConfigError(f"ep={self.ep} needs num_experts divisible by ep, got "
                              f"num_experts={model.num_experts}")
        if (model.is_moe and self.etp != self.tp and self.tp > 1
                and not self.sequence_parallel):
            raise ConfigError(
                f"expert_tensor_parallel={self.etp} differs from tp={self.tp}: needs "
                f"sequence_parallel (Megatron-Core's MoE layer refuses tp > 1 without it in "
                f"training; without it the experts are split by tp as the dense MLP is)")
        if (self.zero_stage == 3 or self.fsdp == "hybrid") and self.experts_reduce_apart(model):
            raise ConfigError(
                f"zero_stage={self.zero_stage} fsdp={self.fsdp!r} with ep={self.ep} etp="
                f"{self.etp}: the routed experts would be sharded over their expert data-"
                f"parallel group (edp={self.edp}) apart from the dense weights, which is not "
                f"modelled; use zero_stage <= 2 with fsdp='none' (Megatron's distributed "
                f"optimizer) or ep=1 with etp=tp")
        if model.micro_batch_size != self.micro_batch_size:
            raise ConfigError(f"micro_batch_size differs: model has {model.micro_batch_size}, "
                              f"parallel config has {self.micro_batch_size}")
