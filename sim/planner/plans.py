"""Screening plans: the Plan of each of many layouts, with stage costs computed once per
cost key, for the planner's memory check and bound (not for the replay).

`schedules.plan.resolve` spends most of its time on the stage and layer-group costs
(schedules.costs), which depend on the degrees, micro-batch, recompute and pipeline split
(`Layout.cost_key`), not on the data-parallel degree, the ZeRO stage, the rank order or
which schedule of the same virtual stages runs. `PlanCache.plan` resolves one layout of
each cost key with `resolve` itself (every check, in its order) as ZeRO-0 with one
gradient bucket per stage (with data parallelism), so that its data-parallel pass has
one layer group; every
layout of the key then takes that template with its own ParallelConfig, schedule name,
microbatches and shard group (schedules.sharding), after the checks that read them (the
op budget, ParallelConfig.check_model). A screening plan equals `resolve`'s but for
`layer_groups` and `group_costs` (one group per stage), which only the lowering reads:
the replay (sim.simulate) resolves its own. tests/test_planner_plans.py checks both.
"""
from __future__ import annotations

import dataclasses

from clustersim.schedules.cluster_facts import ClusterFacts
from clustersim.schedules.limits import check_op_budget
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import Plan, resolve
from clustersim.schedules.registry import schedule_entry
from clustersim.schedules.sharding import shard_group_size

from .space import Layout

ONE_BUCKET = 1 << 62  # bytes: a bucket no stage fills, so the DP pass has one layer group


def cost_key(layout: Layout) -> tuple:
    """What a layout's stage costs and split depend on (module docstring)."""
    return (layout.tp, layout.cp, layout.ep, layout.micro_batch_size, layout.recompute,
            layout.sequence_parallel, layout.pp, layout.vpp,
            schedule_entry(layout.schedule).placement)


class PlanCache:
    """Screening plans of one model on one cluster (module docstring)."""

    def __init__(self, model: ModelSpec, cluster: ClusterFacts):
        self.model, self.cluster = model, cluster
        self._templates: dict[tuple, Plan] = {}

    def plan(self, layout: Layout, parallel: ParallelConfig) -> Plan:
        """The screening plan of `layout` (its ParallelConfig `parallel`); ConfigError
        as `resolve` raises it."""
        key = cost_key(layout)
        template = self._templates.get(key)
        if template is None:
            bucket = ONE_BUCKET if parallel.grad_replicas > 1 else None  # (else refused)
            one_group = dataclasses.replace(parallel, zero_stage=0, fsdp="none",
                                            bucket_bytes=bucket)
            template = self._templates[key] = resolve(self.model, one_group, self.cluster)
        check_op_budget(parallel.num_stages, parallel.num_microbatches, template.max_ops)
        parallel.check_model(self.model)
        return dataclasses.replace(
            template, parallel=parallel, schedule=schedule_entry(parallel.schedule).name,
            num_microbatches=parallel.num_microbatches,
            dp_shard_size=shard_group_size(parallel, self.cluster))
