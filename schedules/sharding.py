"""Data-parallel sharding of a ParallelConfig: one canonical form and the rules it obeys.

Canonical form (what `normalised_sharding` returns):
- `zero_stage` says WHAT is sharded over the data-parallel ranks (ZeRO, Rajbhandari et al.
  SC20: 1 optimizer state, 2 + gradients, 3 + parameters); `fsdp` says over WHICH ranks
  when parameters or gradients are sharded: 'full' = all dp ranks, 'hybrid' = a shard
  group of `shard_size` ranks (torch HSDP), replicated across groups.
- fsdp='full' is ZeRO-3 (torch FULL_SHARD): zero_stage 0 becomes 3, and zero_stage=3 with
  fsdp='none' becomes fsdp='full', so both spellings compare equal. ZeRO-2 over all dp
  ranks (torch SHARD_GRAD_OP) stays fsdp='none'.
- fsdp='hybrid' is torch HYBRID_SHARD (zero_stage 3, the default) or
  _HYBRID_SHARD_ZERO2 (zero_stage 2).

Rules (each ConfigError names the fields and the rule):
- Sharding with pipeline parallelism (pp > 1) follows the framework that runs it:
  - ZeRO-1 (zero_stage 1): DeepSpeed pipelines and Megatron-LM's distributed optimizer
    (`--use-distributed-optimizer`), unchanged from pp = 1.
  - ZeRO-2 (zero_stage 2, fsdp 'none' or 'hybrid'): Megatron-FSDP's "optim_grads"
    (megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py, the gradient
    hook: `grad_reduce_every_bprop` for optim_grads / optim_grads_params, so every
    microbatch's backward reduce-scatters its gradients into the gradient shard; the
    HSDP outer reduction only on the last microbatch). Megatron-LM's arguments.py does
    not refuse it with pp > 1 (its FSDP v2 adapter does; v1 is the default).
    schedules.data_parallel models it; it needs overlap_grad_reduce (the reduce-scatter
    runs from the backward hook).
  - ZeRO-3 / FSDP / HSDP (zero_stage 3): torchtitan's FSDP2 (`fully_shard`) under
    torch.distributed.pipelining (torchtitan/distributed/fsdp.py,
    get_fsdp_reshard_after_forward_policy: reshard_after_forward defaults to off with
    PP; torch/distributed/pipelining/stage.py: backward_maybe_with_nosync turns gradient
    sync and reshard-after-backward off for every microbatch, and _post_backward /
    perform_reduce_grad reduce-scatters once per step). schedules.zero3 models it.
  - still refused with pp > 1, each naming its rule: ZeRO++ (qwZ, hpZ, qgZ: DeepSpeed's
    ZeRO-3 engine, whose PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with
    pipeline parallelism", deepspeed/runtime/pipe/engine.py) and offload with zero_stage
    >= 2 (ZeRO-Offload is DeepSpeed's; FSDP2's or Megatron-FSDP's CPU offload under a
    pipeline is not modelled).
- ZeRO++ (Wang et al. 2023; DeepSpeed `zero_quantized_weights`, `zero_hpz_partition_size`,
  `zero_quantized_gradients`): qwZ and hpZ act on ZeRO-3's parameter all-gathers, so they
  need zero_stage 3; qgZ replaces the gradient reduce-scatter, so it needs zero_stage >= 2
  (DeepSpeed implements it in its ZeRO-3 engine). hpZ keeps its secondary shard inside a
  node, as hybrid sharding does already, so the two do not combine.
- offload (ZeRO-Offload, Ren et al. 2021) moves the optimizer partition to the host:
  zero_stage >= 1 (DeepSpeed accepts offload_optimizer for stages 1-3).
- shard_size needs fsdp='hybrid' and must divide dp; hpz_partition_size needs hpz and must
  divide dp. Both None mean "the dp ranks on one node", resolved with the cluster by
  `shard_group_size`, which checks that a hybrid group then sits inside a node boundary.
- zero_stage >= 1 with dp * cp == 1 is allowed: the one shard is the whole state, so
  memory and communication equal zero_stage 0's.
- With context parallelism the CP ranks hold the same weights and reduce their gradients
  together: every data-parallel collective runs over the dp x cp ranks ('dp_cp', Megatron-
  Core's data-parallel group with context parallel) and ZeRO shards over them; hybrid and
  hpZ shard groups inside it are refused (not modelled).
"""
from __future__ import annotations

from typing import Any

from .cluster_facts import ClusterFacts
from .errors import ConfigError
from .names import DP, DP_REPLICATE, DP_SHARD
from .nested_groups import across_blocks, block_of

# torch DDP's default bucket_cap_mb = 25 (MiB); used when bucket_bytes is None.
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


def normalised_sharding(cfg: Any) -> dict[str, Any]:
    """The canonical (zero_stage, fsdp) of ParallelConfig `cfg`; raises ConfigError when
    the sharding fields break a rule in the module docstring."""
    zero, fsdp = cfg.zero_stage, cfg.fsdp
    if fsdp == "full":
        if zero in (1, 2):
            raise ConfigError(
                f"fsdp='full' shards parameters (ZeRO-3) but zero_stage={zero}: set "
                f"zero_stage=3 (or leave it 0), or fsdp='none' for ZeRO-{zero} "
                f"(torch SHARD_GRAD_OP is zero_stage=2, fsdp='none')")
        zero = 3
    elif fsdp == "hybrid":
        if zero == 1:
            raise ConfigError(
                "fsdp='hybrid' shards gradients (zero_stage=2, torch _HYBRID_SHARD_ZERO2) "
                "or parameters too (zero_stage=3, HYBRID_SHARD), but zero_stage=1: set "
                "zero_stage 2 or 3, or fsdp='none' for ZeRO-1")
        zero = zero or 3
    elif zero == 3:
        fsdp = "full"
    _check_rules(cfg, zero, fsdp)
    return {"zero_stage": zero, "fsdp": fsdp}


def _check_rules(cfg: Any, zero: int, fsdp: str) -> None:
    if zero >= 2 and cfg.pp > 1:
        _check_pipelined(cfg, zero, fsdp)
    if cfg.quantized_weights and zero != 3:
        raise ConfigError(f"quantized_weights (ZeRO++ qwZ) quantizes ZeRO-3's parameter "
                          f"all-gather: it needs zero_stage=3, got zero_stage={zero}")
    if cfg.hpz and zero != 3:
        raise ConfigError(f"hpz (ZeRO++ hpZ) keeps a secondary ZeRO-3 parameter shard: it "
                          f"needs zero_stage=3, got zero_stage={zero}")
    if (fsdp == "hybrid" or cfg.hpz) and cfg.cp > 1:
        raise ConfigError(f"{'hpz' if cfg.hpz else 'fsdp=hybrid'} with cp={cfg.cp}: dense "
                          f"gradients reduce over dp x cp ranks (Megatron-Core), and shard "
                          f"groups inside that group are not modelled; use fsdp='full' or "
                          f"zero_stage <= 2, or cp=1")
    if cfg.hpz and fsdp == "hybrid":
        raise ConfigError("hpz with fsdp='hybrid': both shard parameters inside a node; "
                          "choose one (hpz for DeepSpeed ZeRO++, hybrid for torch HSDP)")
    if cfg.quantized_gradients and zero < 2:
        raise ConfigError(f"quantized_gradients (ZeRO++ qgZ) replaces the gradient "
                          f"reduce-scatter: it needs zero_stage >= 2, got zero_stage={zero}")
    if cfg.offload and zero < 1:
        raise ConfigError("offload (ZeRO-Offload) moves the optimizer-state partition to the "
                          "host: it needs zero_stage >= 1, got zero_stage=0")
    for size_field, owner, needed in (("shard_size", "fsdp", fsdp == "hybrid"),
                                      ("hpz_partition_size", "hpz", cfg.hpz)):
        size = getattr(cfg, size_field)
        if size is None:
            continue
        if not needed:
            want, got = ("fsdp='hybrid'", fsdp) if owner == "fsdp" else ("hpz=True", cfg.hpz)
            raise ConfigError(f"{size_field}={size} needs {want}, got {owner}={got!r}")
        if cfg.dp % size:
            raise ConfigError(f"{size_field}={size} must divide dp={cfg.dp}")
    _check_applies(cfg, zero)


def _check_pipelined(cfg: Any, zero: int, fsdp: str) -> None:
    """Refuse what no modelled framework runs with ZeRO-2/3 and pp > 1 (module docstring):
    ZeRO++, offload, and ZeRO-2 without overlap_grad_reduce."""
    for name, given in (("quantized_weights", cfg.quantized_weights), ("hpz", cfg.hpz),
                        ("quantized_gradients", cfg.quantized_gradients)):
        if given:
            raise ConfigError(
                f"{name} (ZeRO++) with zero_stage={zero} and pp={cfg.pp}: ZeRO++ lives in "
                f"DeepSpeed's ZeRO-3 engine, and DeepSpeed's PipelineEngine refuses ZeRO-2/3 "
                f"('ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'); use pp=1, "
                f"or FSDP (zero_stage=3) without ZeRO++")
    if cfg.offload:
        raise ConfigError(
            f"offload with zero_stage={zero} and pp={cfg.pp}: ZeRO-Offload is DeepSpeed's, "
            f"whose PipelineEngine refuses ZeRO-2/3; CPU offload of FSDP2 or Megatron-FSDP "
            f"under a pipeline is not modelled; use zero_stage=1 with offload, or pp=1")
    if zero == 2 and not cfg.overlap_grad_reduce:
        raise ConfigError(
            f"overlap_grad_reduce=False with zero_stage=2 (fsdp={fsdp!r}) and pp={cfg.pp}: "
            f"ZeRO-2 with a pipeline is Megatron-FSDP's optim_grads, which reduce-scatters "
            f"every microbatch's gradients from the backward hook; reducing after the "
            f"backward is not modelled")


def _check_applies(cfg: Any, zero: int) -> None:
    """Refuse a data-parallel option set where the modelled passes cannot act on it."""
    if not cfg.reshard_after_forward and zero != 3:
        raise ConfigError(f"reshard_after_forward=False keeps ZeRO-3/FSDP's gathered "
                          f"parameters from forward to backward: it needs zero_stage=3, got "
                          f"zero_stage={zero} (whose parameters are never resharded)")
    if not moves_gradients(cfg):
        for name, given in (("overlap_grad_reduce=False", not cfg.overlap_grad_reduce),
                            (f"bucket_bytes={cfg.bucket_bytes}", cfg.bucket_bytes is not None)):
            if given:
                raise ConfigError(f"{name}: with dp*cp=1 and no offload no gradient leaves "
                                  f"the rank (one replica of the weights), so there is "
                                  f"nothing to reduce in buckets or overlap")
    if cfg.overlap_param_gather and (zero not in (1, 2) or cfg.dp * cfg.cp == 1
                                     or not cfg.overlap_grad_reduce):
        raise ConfigError(
            f"overlap_param_gather overlaps the distributed optimizer's parameter all-gather "
            f"with the next forward: it needs zero_stage 1 or 2 (got {zero}), dp*cp > 1 (got "
            f"{cfg.dp * cfg.cp}) and overlap_grad_reduce (Megatron-LM: --overlap-param-gather "
            f"needs --use-distributed-optimizer and --overlap-grad-reduce)")
    if zero == 3 and not cfg.overlap_grad_reduce:
        raise ConfigError("overlap_grad_reduce=False with zero_stage=3: ZeRO-3/FSDP reduce-"
                          "scatters each layer's gradients as its backward ends (every "
                          "microbatch); reducing after the whole backward is not modelled")
    if zero == 3 and cfg.bucket_bytes is not None:
        raise ConfigError(f"bucket_bytes={cfg.bucket_bytes} with zero_stage=3: ZeRO-3/FSDP "
                          f"gathers and reduce-scatters one layer unit at a time, not in "
                          f"gradient buckets")


def moves_gradients(cfg: Any) -> bool:
    """Whether gradients leave the rank: to the other ranks holding the same weights (dp x
    cp, ParallelConfig.grad_replicas), or to the host (offload). Otherwise the
    data-parallel pass adds only the optimizer steps."""
    return cfg.grad_replicas > 1 or cfg.offload


def shard_group_size(cfg: Any, cluster: ClusterFacts | None = None) -> int | None:
    """Ranks of the 'dp_shard' group (the ONE place this size is resolved): a hybrid
    shard group (fsdp='hybrid': shard_size) or an hpZ secondary partition (hpz:
    hpz_partition_size), as given, else the dp ranks that share the host of the first
    replica's rank (ClusterFacts.dp_ranks_per_node); None when the run has no such group,
    or when it is not given and there is no cluster to take it from (the kernels backend;
    the consumers then name the missing field). A hybrid shard group of a whole
    single-node dp group has no node boundary to replicate across and is refused."""
    if cfg.fsdp == "hybrid":
        field, given = "shard_size", cfg.shard_size
    elif cfg.hpz:
        field, given = "hpz_partition_size", cfg.hpz_partition_size
    else:
        return None
    if given is None and cluster is None:
        return None
    size = given if given is not None else cluster.dp_ranks_per_node(cfg)
    if cfg.dp % size:
        raise ConfigError(f"{field}={size} must divide dp={cfg.dp}: shard groups tile "
                          f"the data-parallel group")
    if cfg.fsdp == "hybrid" and size == cfg.dp:
        where = (f"all dp={cfg.dp} ranks sit on one node of topology {cluster.name!r}"
                 if given is None else f"shard_size={size} equals dp")
        raise ConfigError(f"fsdp='hybrid' shards inside a node and replicates across nodes, "
                          f"but {where}: there is no node boundary to replicate across; set "
                          f"shard_size to a divisor of dp smaller than dp, or use fsdp='full'")
    return size


def state_shard_degree(cfg: Any, shard_group: int | None) -> int:
    """N of the ZeRO memory formulas, the ranks one copy of the sharded model state is
    split over: dp * cp (Megatron shards over the data-parallel group with context
    parallelism), or the hybrid shard group (shard_group_size) capped at dp * cp."""
    group = cfg.dp * cfg.cp
    if cfg.fsdp != "hybrid":
        return group
    if shard_group is None:
        raise ConfigError("fsdp='hybrid' needs shard_size, or a topology to take the dp "
                          "ranks per node from")
    return min(shard_group, group)


def hpz_degree(cfg: Any, shard_group: int | None) -> int:
    """Ranks the ZeRO++ hpZ secondary parameter shard is split over (inside a node): the
    hpZ partition (shard_group_size) capped at dp * cp."""
    if shard_group is None:
        raise ConfigError("hpz needs hpz_partition_size, or a topology to take the dp ranks "
                          "per node from")
    return min(shard_group, cfg.dp * cfg.cp)


def group_ranks(parallel: Any, axis: str, rank: int, shard: int | None) -> list[int]:
    """Global ranks of `rank`'s group along DP axis `axis` ('dp'; 'dp_shard' = the block of
    `shard` consecutive dp coordinates holding it; 'dp_replicate' = the dp coordinates
    congruent to its own modulo `shard`, one per shard group)."""
    group = parallel.group(DP, rank)
    if axis == DP:
        return group
    if shard is None:
        raise ConfigError(f"group {axis!r} needs a shard size (fsdp='hybrid' or hpz)")
    if axis == DP_SHARD:
        return block_of(group, rank, shard)
    if axis == DP_REPLICATE:
        return across_blocks(group, rank, shard)
    raise ConfigError(f"unknown data-parallel group {axis!r}: dp, dp_shard or dp_replicate")
