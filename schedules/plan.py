"""The Plan: the facts of one run, resolved once from (model, parallel config, cluster
facts, schedule), and read by every pass, cost model, memory model, report and the kernels
worker. Nothing else derives these facts (docs/architecture.md, "The Plan"):

- the schedule's shape: its name, pipeline ranks, virtual stages, microbatches, and the
  placement of stages on ranks (schedules.placement: loop or V; a custom schedule's own);
- the pipeline split (schedules.pipeline_split): layers per stage and their offsets;
- the costs of each stage and of each layer group of the data-parallel pass
  (schedules.costs, schedules.layer_groups; FLOPs, bytes, parameters per micro-batch
  per rank);
- every group's size and members along each axis (schedules.names: tp, cp, pp, dp, ep,
  etp, edp, dp_shard, dp_replicate), with the shard-group size resolved once
  (schedules.sharding.shard_group_size; the ZeRO memory formulas' N follows from it,
  schedules.sharding.state_shard_degree);
- with cluster facts (schedules.cluster_facts): the GPU of every pipeline rank that is
  replayed, and which groups span hosts;
- what is replayed op by op (the pipeline ranks of replica 0: one program per pipeline
  rank, schedules.schedule) and what is assumed identical (every other replica).

`resolve` checks, in order: the schedule's shape against the config, the pipeline split,
the model against the config (ParallelConfig.check_model), the shard group; it builds no
program table, so it is cheap. A plan that places ranks on GPUs (`devices`, what the
simulator replays) needs a cluster with a GPU for every rank; the memory report does
not. `Plan.build_schedule()` builds the compute-only schedule a registered schedule name
gives. `Plan.describe()` is what the outputs store (metrics and Timeline JSON:
meta['plan']) and `Plan.header()` the run's header line. Units: bytes, FLOPs, parameter
counts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

from .cluster_facts import ClusterFacts
from .costs import StageCost, costs_for_layers
from .errors import ConfigError
from .layer_groups import ChunkParts, chunk_parts, data_parallel_groups, group_costs
from .limits import MAX_OPS, check_op_budget
from .model import ModelSpec
from .chains import StageChains
from .names import (CP_A2A, CP_RING, DP, DP_CP, DP_DEP, DP_REPLICATE, DP_SHARD, EDP,
                    EXPERT_AXES, GRID_AXES, PP, PP_COPIES, TP, TP_COL, TP_DEP, TP_GRID_GROUPS,
                    TP_INPUT, TP_INPUT_WEIGHT, TP_OUTPUT, TP_OUTPUT_WEIGHT, TP_ROW, TP_WEIGHT)
from .parallel import CUSTOM_SCHEDULE, ParallelConfig
from .pipeline_split import stage_layers, stage_offsets
from .placement import PLACEMENTS
from .placement import stage_ranks as placed
from .recompute import check_fits
from .recompute import describe as describe_recompute
from .registry import schedule_entry
from .schedule import Schedule
from .sharding import group_ranks, shard_group_size
from .tp_grid import tp_grid

GROUP_AXES = (*GRID_AXES, DP_CP, *(a for a in EXPERT_AXES if a not in GRID_AXES), DP_SHARD,
              DP_REPLICATE, CP_A2A, CP_RING, PP_COPIES, TP_ROW, TP_COL, TP_DEP, DP_DEP,
              TP_INPUT, TP_WEIGHT, TP_OUTPUT, TP_INPUT_WEIGHT, TP_OUTPUT_WEIGHT)


@dataclass(frozen=True)
class Plan:
    """One run's resolved facts (module docstring). Build it with `resolve`."""

    model: ModelSpec
    parallel: ParallelConfig
    schedule: str
    placement: str  # 'loop', 'v', or 'custom' (a placement no registered schedule uses)
    registered: bool  # a registered schedule (False: the schedule was given as data)
    num_microbatches: int
    stage_ranks: tuple[int, ...]
    stage_layers: tuple[int, ...]
    layer_groups: int  # G, the data-parallel pass's layer groups (or a given schedule's)
    stage_costs: tuple[StageCost, ...]
    group_costs: tuple[tuple[StageCost, ...], ...]  # [stage][group] for G groups
    dp_shard_size: int | None  # the 'dp_shard' group (hybrid or hpZ), None without one
    cluster: ClusterFacts | None = None
    max_ops: int = MAX_OPS  # the op budget of a schedule built from the registry
    chains: int = 1  # stage chains (directions), schedules.chains: DualPipe's 2

    # --- the pipeline ----------------------------------------------------------------
    @property
    def pp(self) -> int:
        return self.parallel.pp

    @property
    def num_stages(self) -> int:
        return len(self.stage_ranks)

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // self.pp

    @property
    def stage_chains(self) -> StageChains:
        """The stage chains (schedules.chains): one, or DualPipe's two directions."""
        return StageChains(self.num_stages, self.chains, self.num_microbatches)

    @property
    def model_stages(self) -> int:
        """The stages the model is cut into (one chain's: the stages of the other chains
        are copies of them)."""
        return self.num_stages // self.chains

    @property
    def stage_offsets(self) -> tuple[int, ...]:
        """Index of each stage's first layer (0-based, model order)."""
        return stage_offsets(self.stage_layers[:self.model_stages]) * self.chains

    def stages_of(self, pipeline_rank: int) -> list[int]:
        """The virtual stages pipeline rank `pipeline_rank` holds, in stage order."""
        return list(self._rank_stages.get(pipeline_rank, ()))

    @cached_property
    def _rank_stages(self) -> dict[int, tuple[int, ...]]:
        """Pipeline rank -> its stages (stages_of), once per Plan."""
        held: dict[int, list[int]] = {}
        for s, r in enumerate(self.stage_ranks):
            held.setdefault(r, []).append(s)
        return {r: tuple(stages) for r, stages in held.items()}

    def chunk_parts(self, stage: int, chunk: int | None, groups: int) -> ChunkParts:
        """The layers, embedding and head a (stage, layer group) op runs, the stage split
        into `groups` groups (schedules.layer_groups.chunk_parts)."""
        chains = self.stage_chains
        return chunk_parts(self.stage_layers[:chains.length], chains.model_stage(stage),
                           chunk, groups)

    def costs_of(self, stage: int, chunk: int | None) -> StageCost:
        """The costs of a stage (chunk None) or of layer group `chunk` of it."""
        return self.stage_costs[stage] if chunk is None else self.group_costs[stage][chunk]

    def build_schedule(self) -> Schedule:
        """The compute-only schedule of a registered schedule name (schedules.registry)."""
        if not self.registered:
            raise ConfigError(f"schedule {self.schedule!r} was given as data: it has no "
                              f"generator; use the schedule itself")
        return schedule_entry(self.schedule).build(self.pp, self.num_microbatches,
                                                   self.stages_per_rank, self.max_ops)

    # --- groups ----------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    def group(self, axis: str, rank: int) -> list[int]:
        """Global ranks of `rank`'s group along `axis` (GROUP_AXES), in axis order;
        computed once per (axis, rank) and Plan (the replay and the planner's bounds ask
        for the same groups again and again)."""
        key = (axis, rank)
        hit = self._groups.get(key) if type(rank) is int else None
        if hit is None:
            hit = tuple(self._group(axis, rank))
            if type(rank) is int:
                self._groups[key] = hit
        return list(hit)

    @cached_property
    def _groups(self) -> dict[tuple[str, int], tuple[int, ...]]:
        return {}

    def _group(self, axis: str, rank: int) -> list[int]:
        if axis in (DP_SHARD, DP_REPLICATE):
            return group_ranks(self.parallel, axis, rank, self.dp_shard_size)
        if axis in TP_GRID_GROUPS:  # 2D, 2.5D, 3D tensor parallelism (schedules.tp_grid)
            line, grid = self.parallel.group(TP, rank), tp_grid(self.parallel)
            if grid is None:
                raise ConfigError(f"group {axis!r} is a tp grid's: tp_mode='1d' has none")
            return [line[t] for t in grid.members(axis, self.parallel.coords(rank)[TP])]
        if axis == DP_DEP:  # 2.5D: the dp ranks' depth slices, which hold the same weights
            return sorted(r for d in self.parallel.group(DP, rank)
                          for r in self.group(TP_DEP, d))
        if axis == PP_COPIES:  # DualPipe: pipeline ranks r and P-1-r (schedules.chains)
            line, r = self.parallel.group(PP, rank), self.parallel.coords(rank)[PP]
            return sorted({line[r], line[self.pp - 1 - r]})
        return self.parallel.group(axis, rank)

    def group_size(self, axis: str) -> int:
        return len(self.group(axis, 0))

    @property
    def grid_groups(self) -> tuple[str, ...]:
        """The groups of a 2D, 2.5D or 3D tp grid (and 2.5D's 'dp_dep'); () for 1D."""
        grid = tp_grid(self.parallel)
        return () if grid is None else grid.groups + ((DP_DEP,) if grid.depth > 1 else ())

    @property
    def grad_group(self) -> str:
        """The group dense gradients reduce over and ZeRO shards over: 'dp', or 'dp_cp'
        when cp > 1 (the CP ranks hold the same weights; Megatron-Core's data-parallel
        group with context parallel), or 'dp_dep' under 2.5D tensor parallelism (its depth
        slices hold the same weights: schedules.tp_grid)."""
        if self.parallel.tp_mode == "2.5d":
            return DP_DEP
        return DP_CP if self.parallel.cp > 1 else DP

    @property
    def expert_grad_group(self) -> str | None:
        """'edp' when the routed experts reduce apart from the dense weights
        (ParallelConfig.experts_reduce_apart), else None (they ride with the dense ones)."""
        return EDP if self.parallel.experts_reduce_apart(self.model) else None

    @property
    def comm_shards(self) -> int:
        """Ranks a sharded gradient or parameter collective splits its bytes over: the
        hybrid shard group, else the ranks of `grad_group`."""
        if self.parallel.fsdp == "hybrid":
            return self.dp_shard_size
        return self.parallel.grad_replicas

    # --- what is replayed, and where ---------------------------------------------------
    @cached_property
    def replayed_ranks(self) -> tuple[int, ...]:
        """Global rank of each pipeline rank of replica 0 (tp = cp = dp = 0): the ranks
        the simulator replays op by op; every other rank runs the same program as the
        replayed rank of its pipeline coordinate and is assumed to take the same time.
        Computed once per Plan (the planner's bounds ask it per stage and op kind)."""
        return tuple(self.parallel.rank(pp=r) for r in range(self.pp))

    @property
    def devices(self) -> tuple[str, ...]:
        """GPU node of each replayed pipeline rank (needs cluster facts with a GPU for every
        rank of the grid)."""
        if self.cluster is None:
            raise ConfigError("this plan has no cluster: resolve it with cluster facts")
        self.cluster.check_fits(self.world_size)
        return tuple(self.cluster.gpus[g] for g in self.replayed_ranks)

    def ranks_on_host(self, stage: int) -> int:
        """Ranks of the job whose GPUs share the host of stage `stage`'s replayed rank (1
        without a cluster): they share that host's CPU and memory (ZeRO-Offload)."""
        if self.cluster is None:
            return 1
        host = self.cluster.hosts[self.replayed_ranks[self.stage_ranks[stage]]]
        return self.cluster.hosts[:self.world_size].count(host)

    def groups(self, axis: str) -> list[list[int]]:
        """Every `axis` group of the job once (global ranks), in order of its first rank."""
        found, seen = [], set()
        for rank in range(self.world_size):
            if rank not in seen:
                group = self.group(axis, rank)
                seen.update(group)
                found.append(group)
        return found

    def groups_spanning_hosts(self, axis: str) -> list[list[int]]:
        """The `axis` groups (global ranks) whose GPUs sit on more than one host."""
        if self.cluster is None:
            return []
        return [g for g in self.groups(axis) if self.cluster.spans_hosts(g)]

    # --- outputs ---------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The plan as JSON-able data: the outputs store it as meta['plan']."""
        p = self.parallel
        cluster = self.cluster
        return {
            "schedule": self.schedule, "placement": self.placement, "pp": p.pp,
            "vpp": self.stages_per_rank, "dp": p.dp, "tp": p.tp, "cp": p.cp, "ep": p.ep,
            "etp": p.etp, "edp": p.edp, "microbatches": self.num_microbatches,
            "global_batch_size": p.global_batch_size, "micro_batch_size": p.micro_batch_size,
            "model": self.model.name or "custom", "model_spec": asdict(self.model),
            "model_params": self.model.param_count(),
            "parallel": asdict(p), "stage_ranks": list(self.stage_ranks),
            "stage_layers": list(self.stage_layers), "layer_groups": self.layer_groups,
            "groups": {axis: self.group_size(axis) for axis in GROUP_AXES
                       if (axis not in (DP_SHARD, DP_REPLICATE) or self.dp_shard_size)
                       and (axis != DP_CP or p.cp > 1)
                       and (axis not in (CP_A2A, CP_RING) or p.cp_comm == "usp")
                       and (axis != PP_COPIES or self.chains > 1)
                       and (axis not in TP_GRID_GROUPS | {DP_DEP}
                            or axis in self.grid_groups)},
            "topology": cluster.name if cluster else None,
            "device": cluster.device if cluster else None,
            "device_memory_bytes": cluster.memory_bytes if cluster else None,
            "devices": list(self.devices) if cluster and cluster.num_gpus >= self.world_size
            else None,
            "replayed_ranks": list(self.replayed_ranks), "world_size": self.world_size,
        }

    def replay_statement(self) -> str:
        """What a simulation of this plan replays and what it assumes, in one sentence."""
        n, m = self.pp, self.world_size
        if self.parallel.dp_impl == "dataparallel":
            return (f"GPU 0 of {m} replayed op by op (torch.nn.DataParallel, one process: the "
                    f"other {m - 1} GPUs run the same forward and backward on their replicas "
                    f"and keep no gradients; GPU 0 alone steps)")
        if n == m:
            return f"all {m} GPUs replayed op by op (one pipeline replica, no other)"
        return (f"{n} of {m} GPUs replayed op by op (the pipeline ranks of replica 0: "
                f"global ranks {list(self.replayed_ranks) if n <= 8 else '...'}); the other "
                f"{m - n} assumed identical to the replayed rank of their pipeline "
                f"coordinate, their collectives' traffic on shared links included")

    def header(self) -> str:
        """The run's header line (header_line of describe())."""
        return header_line(self.describe())


def model_line(plan: dict[str, Any]) -> str:
    """The resolved model of a described plan: its shape and parameter count (SC21 eq. 2
    generalised, ModelSpec.param_count)."""
    m = plan["model_spec"]
    mlp = "SwiGLU" if m["swiglu"] else "GeLU"
    tied = "untied" if m["untie_embeddings_and_output_weights"] else "tied"
    return (f"model {plan['model']}: {m['num_layers']} layers, hidden {m['hidden_size']}, "
            f"ffn {m['ffn_hidden_size']} ({mlp}), heads {m['num_attention_heads']} / KV "
            f"groups {m['num_query_groups']}, vocabulary {m['vocab_size']} ({tied}), "
            f"sequence {m['seq_length']}, {m['normalization']}, {m['dtype']}, "
            f"{'flash' if m['use_flash_attn'] else 'unfused'} attention: "
            f"{plan['model_params'] / 1e9:.2f} B parameters")


def header_line(plan: dict[str, Any]) -> str:
    """One line from a described plan (Plan.describe): schedule, the degrees that are not
    1, the ZeRO stage when sharded, microbatches and their size, recompute, model, topology
    (or 'this host' for a run without one)."""
    axes = "".join(f" {axis}={plan[axis]}" for axis in ("dp", "tp", "cp", "ep")
                   if plan[axis] != 1)
    if plan["etp"] != plan["tp"]:
        axes += f" etp={plan['etp']}"
    p = plan["parallel"]
    axes += "".join(f" {key}={p[key]}" for key, default in (("tp_mode", "1d"),
                                                             ("tp_depth", None),
                                                             ("dp_impl", "ddp"))
                    if p.get(key, default) != default)
    recompute = ("" if p["recompute"] == "none" else " recompute=" + describe_recompute(
        p["recompute"], p["recompute_method"], p["recompute_num_layers"]))
    zero = f" zero={p['zero_stage']}" if p.get("zero_stage") else ""
    return (f"{plan['schedule']}: pp={plan['pp']} vpp={plan['vpp']}{axes}{zero} "
            f"microbatches={plan['microbatches']} mbs={plan['micro_batch_size']}{recompute} "
            f"model={plan['model']} topology={plan['topology'] or 'this host'}")


def _check_chain_split(model: ModelSpec, parallel: ParallelConfig, name: str,
                       model_stages: int) -> None:
    """DualPipe cuts the model into pp stages and holds each twice: an even split only
    (the uneven-split flags name the first and last pipeline rank's layers, and each of
    those ranks holds a first or last stage and a copy of another)."""
    uneven = [flag for flag in ("first_stage_layers", "last_stage_layers",
                                "account_for_embedding", "account_for_loss")
              if getattr(parallel, flag)]
    if uneven:
        raise ConfigError(f"{uneven[0]} with schedule {name!r}: every rank holds two stages "
                          f"(a stage and a copy of another, schedules.chains), so the split "
                          f"is even: leave the uneven-split flags unset")
    if model.num_layers % model_stages:
        raise ConfigError(f"num_layers={model.num_layers} is not divisible by the "
                          f"{model_stages} stages schedule {name!r} cuts the model into (each "
                          f"held twice, schedules.chains)")


def resolve(model: ModelSpec, parallel: ParallelConfig, cluster: ClusterFacts | None = None,
            schedule: Schedule | None = None, max_ops: int = MAX_OPS) -> Plan:
    """The Plan of running `model` split by `parallel` on `cluster` (None: no topology, as
    in the kernels backend), with `schedule`'s shape when one is given as data (a custom
    or partly lowered schedule) and otherwise the registered schedule `parallel` names.
    `max_ops`: the op budget of a registered schedule (schedules.limits), checked first."""
    if schedule is None:
        entry = schedule_entry(parallel.schedule)
        chains = entry.chains
        if parallel.num_stages // chains > model.num_layers:
            raise ConfigError(f"{parallel.num_stages // chains} model stages (pp*vpp / its "
                              f"{chains} stage chains) need at least as many layers, the model "
                              f"has num_layers={model.num_layers}" if chains > 1 else
                              f"pp*vpp={parallel.num_stages} stages need at least as many "
                              f"layers, the model has num_layers={model.num_layers}")
        check_op_budget(parallel.num_stages,
                        entry.simulated_microbatches(parallel.pp, parallel.num_microbatches),
                        max_ops)
        name, placement = entry.name, entry.placement
        ranks = placed(placement, parallel.pp, parallel.num_stages)
        microbatches = parallel.num_microbatches
    else:
        if schedule.num_ranks != parallel.pp:
            raise ConfigError(f"schedule {schedule.name!r} has {schedule.num_ranks} ranks, "
                              f"pp is {parallel.pp}")
        if schedule.iteration_microbatches != parallel.num_microbatches:
            raise ConfigError(f"schedule {schedule.name!r} has {schedule.iteration_microbatches}"
                              f" microbatches, the parallel config {parallel.num_microbatches}")
        name, ranks, chains = schedule.name, schedule.stage_ranks, schedule.chains
        microbatches = schedule.iteration_microbatches
        placement = next((p for p in PLACEMENTS if len(ranks) % parallel.pp == 0
                          and placed(p, parallel.pp, len(ranks)) == ranks), CUSTOM_SCHEDULE)
    # the model's stages (one chain's); further chains hold copies of them (schedules.chains)
    if chains > 1:
        _check_chain_split(model, parallel, name, len(ranks) // chains)
    model_layers = stage_layers(model.num_layers, parallel, ranks[:len(ranks) // chains])
    layers = model_layers * chains
    parallel.check_model(model)
    check_fits(parallel, layers)
    shard = shard_group_size(parallel, cluster)
    groups = (schedule.layer_groups if schedule is not None and schedule.layer_groups > 1
              else data_parallel_groups(model, parallel, layers))
    costs = costs_for_layers(model, parallel, model_layers)
    by_group = ([[c] for c in costs] if groups == 1
                else group_costs(model, parallel, model_layers, groups))
    return Plan(model, parallel, name, placement, schedule is None, microbatches, tuple(ranks),
                layers, groups, tuple(costs) * chains,
                tuple(tuple(row) for row in by_group) * chains, shard, cluster, max_ops, chains)
