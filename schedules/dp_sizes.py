"""Sizes shared by the data-parallel passes (schedules.data_parallel, schedules.zero3):
gradient and parameter bytes per stage and layer group (FP8 parameters gathered in FP8:
DPSizes.param_bytes), buckets, the Adam step's traffic,
and splitting a compute op into its layer groups. Units: bytes, parameters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .names import DP_SHARD, EDP
from .ops import Op, OpKind
from .plan import Plan

ADAM_BYTES_PER_PARAM = 28
"""Memory traffic of one mixed-precision Adam update per parameter: the K = 12 bytes of
fp32 master weight, momentum and variance read and written (2K = 24; ZeRO paper section
3.1 for K), the 16-bit gradient read (2) and the 16-bit parameter written (2)."""


TENSORS_PER_LAYER = 12
"""Parameter tensors of one transformer layer, an upper bound: Llama has 9 (two norms, q,
k, v, o, gate, up, down), GPT-style layers with biases up to 12."""
EXTRA_TENSORS = 3  # word and position embedding, final norm / output layer


@dataclass(frozen=True)
class GradPart:
    """Gradients reduced over one group: the group axis, its ranks, the ranks a reduced
    shard is 1/shard of, whether the shard is then all-reduced over 'dp_replicate'
    (HSDP), and the bytes (per stage or layer group)."""

    group: str
    ranks: int
    shard: int
    replicate: bool
    nbytes: int


@dataclass(frozen=True)
class DPSizes:
    """Per stage s and layer group g: gradient bytes `grads[s][g]`, the parameters it
    owns `params[s][g]` (one rank's TP shard, tied copies included) and those its compute
    needs gathered `gathered[s][g]` (its own, and with tied embeddings on a one-stage
    pipeline the word embedding again for the head, which reuses group 0's weight); the
    routed experts' part of params, `expert_params[s][g]`, when they reduce and shard
    over the expert data-parallel group (`edp` ranks; Plan.expert_grad_group), else 0;
    with FP8 parameters (ModelSpec.fp8_param_gather) the TE linear weights among params,
    `fp8_params[s][g]`, gathered at `fp8_bytes` each (Fp8Recipe.weight_bytes), else 0;
    and the run's sizes."""

    grads: list[list[int]]
    params: list[list[int]]
    gathered: list[list[int]]
    expert_params: list[list[int]]
    dtype_bytes: int
    dp: int  # ranks the dense gradients reduce over (ParallelConfig.grad_replicas)
    grad_group: str  # their group axis (Plan.grad_group)
    shard: int  # ranks one copy of the sharded dense state is split over (N)
    hybrid: bool  # HSDP: reduce-scatter over 'dp_shard', all-reduce over 'dp_replicate'
    edp: int  # ranks the routed experts' gradients reduce over, when apart
    bucket: int
    layers: list[int]  # layers per layer group, per stage
    fp8_params: list[list[float]]
    fp8_bytes: float

    @property
    def groups(self) -> int:
        return len(self.grads[0])

    def stage_params(self, stage: int) -> int:
        return sum(self.params[stage])

    def shard_params(self, stage: int) -> int:
        """Parameters of `stage` whose optimizer state one rank keeps under ZeRO: 1/N of
        the dense ones and 1/edp of the routed experts kept apart."""
        experts = sum(self.expert_params[stage])
        return (math.ceil((self.stage_params(stage) - experts) / self.shard)
                + math.ceil(experts / self.edp))

    def param_bytes(self, params: float, fp8: float) -> int:
        """Bytes of `params` parameters in a parameter all-gather, `fp8` of them TE linear
        weights moving as FP8 (fp8_params), the rest 16-bit."""
        return math.ceil(params * self.dtype_bytes - fp8 * (self.dtype_bytes - self.fp8_bytes))

    def buckets(self, nbytes: int, layers: int) -> list[int]:
        """`nbytes` of gradients (or parameters) of `layers` layers split into
        ceil(nbytes / bucket) near-equal buckets, but no more buckets than tensors: DDP
        and Megatron put whole parameter tensors in a bucket (TENSORS_PER_LAYER per layer,
        plus EXTRA_TENSORS for an embedding or head). Edges fall between elements of
        `dtype_bytes` each, so a bucket never splits a value."""
        most = TENSORS_PER_LAYER * layers + EXTRA_TENSORS
        count = min(most, max(1, math.ceil(nbytes / self.bucket)))
        elements, rest = divmod(nbytes, self.dtype_bytes)
        sizes = [(elements // count + (1 if i < elements % count else 0)) * self.dtype_bytes
                 for i in range(count)]
        sizes[-1] += rest  # bytes that are not whole elements (none for real tensors)
        return sizes

    def parts(self, stage: int, chunk: int | None, gradients: bool = True) -> list[GradPart]:
        """The gradient (or parameter) bytes of (stage, layer group `chunk`; None: the
        whole stage) by the group they reduce (or are gathered) over: the dense ones, then
        the routed experts kept apart."""
        pick = sum if chunk is None else (lambda row: row[chunk])
        experts = pick(self.expert_params[stage]) * self.dtype_bytes
        total = (pick(self.grads[stage]) if gradients else
                 self.param_bytes(pick(self.params[stage]), pick(self.fp8_params[stage])))
        dense = GradPart(DP_SHARD if self.hybrid else self.grad_group, self.dp, self.shard,
                         self.hybrid, total - experts)
        return [dense, *([GradPart(EDP, self.edp, self.edp, False, experts)]
                         if experts else [])]


def dp_sizes(plan: Plan) -> DPSizes:
    """The sizes of `plan`'s data-parallel pass: its G layer groups per stage
    (Plan.layer_groups), their costs, the gradient bucket and the shard group."""
    groups, model = plan.layer_groups, plan.model
    grads = [[c.grad_bytes for c in row] for row in plan.group_costs]
    params = [[c.param_count + c.tied_param_count for c in row] for row in plan.group_costs]
    gathered = [list(row) for row in params]
    if plan.num_stages == 1 and groups > 1 and not model.untie_embeddings_and_output_weights:
        gathered[0][-1] += model.vocab_size * model.hidden_size // plan.parallel.tp
    layers = [c // groups for c in plan.stage_layers]
    apart = plan.expert_grad_group is not None
    experts = [[c.expert_param_count if apart else 0 for c in row] for row in plan.group_costs]
    p = plan.parallel
    fp8 = model.layer_fp8_weight_count(p.tp, p.ep, etp=p.etp) if model.fp8_param_gather else 0
    fp8_params = [[c.layers * fp8 for c in row] for row in plan.group_costs]
    return DPSizes(grads, params, gathered, experts, model.dtype_bytes, p.grad_replicas,
                   plan.grad_group, plan.comm_shards, p.fsdp == "hybrid", p.edp,
                   p.grad_bucket_bytes, layers, fp8_params,
                   model.fp8.weight_bytes if model.fp8 else model.dtype_bytes)


def split_op(op: Op, groups: int) -> list[Op]:
    """`op` as its layer groups: forward in layer order, backward in reverse (`op`
    itself when there is one group)."""
    if groups == 1:
        return [op]
    order = range(groups) if op.kind is OpKind.F else range(groups - 1, -1, -1)
    return [Op(op.kind, op.stage, op.microbatch, op.group, chunk=g, overlapped=op.overlapped)
            for g in order]
