"""Seconds of one engine step of a serving replica: one forward pass of a batch, on a
tensor-parallel group of `tp` GPUs (each GPU does the same work). Units: seconds, bytes,
FLOPs.

A step runs the batch's new tokens (a prompt's, or one per decoding sequence) through
every layer and samples one token per sequence; with pipeline parallelism a StepCost is
one stage's share (its layers, the output layer on the last). Per layer, on one GPU (roofline, as
sim.cost: time = max(FLOPs / achievable FLOP/s, bytes / achievable HBM bandwidth) per
kernel group, summed):
- the layer's GEMMs: 2 x T x P_l / tp FLOPs (T new tokens, P_l the layer's parameters;
  Megatron's 2 FLOPs per multiply-add) reading P_l / tp x weight bytes;
- attention: for a sequence of q new tokens after c cached ones, 4 x d x (heads / tp) x
  (q c + q (q + 1) / 2) FLOPs (QK^T and PV over the causal pairs, d the head dim) reading
  the K and V of its c + q tokens (kv_cache.kv_bytes_per_token per layer);
- with tp > 1, two all-reduces of T x h activations (Megatron's attention and MLP
  outputs), priced by sim.collectives on the topology (NCCL's model on CUDA GPUs), not
  overlapped with compute.
Then the output layer on the step's S sequences: 2 x S x h x V / tp FLOPs reading V h / tp
weights and, with tp > 1, an all-gather of their logits (S x V x activation bytes in
all). Every sequence of the step is charged its row, also a prompt chunk that does not
end its prompt and samples nothing (an overcount of one row per such chunk). So a
memory-bound decode step of B sequences with contexts c_i takes
    L x (P_l / tp x wb + sum_i c_i x kv bytes per token per layer) / (HBM x fraction)
and a compute-bound prefill of T tokens 2 T P / (tp x peak x fraction), plus attention
and communication. Not modelled: the embedding lookup and elementwise kernels, the
host's scheduling and sampling time and kernel launch gaps (vLLM hides most with CUDA
graphs).

Sequence (context) parallelism over `sp` GPUs (each holding all of the stage's weights
/ tp): a prompt's tokens split over them, so its GEMMs and attention run 1/sp per GPU,
and its K and V are all-gathered to every shard per layer; the KV cache is sharded by
position, so a decode step reads 1/sp of it per GPU but all the weights (its one token is
not split), and all-reduces the partial attention outputs (B x h / tp) per layer.

MoE layers (experts sharded over the TP group, as vLLM without expert parallelism; every
token to top-k experts): the layer's other weights (attention, router, shared experts) as
a dense layer's, plus 2 x k x the expert's parameters / tp FLOPs per token, reading the
experts the step's tokens reach, E (1 - (1 - k/E)^T) of them in expectation under uniform
routing (an assumption: real routers are skewed).

Expert parallelism over `ep` GPUs (ep/tp replicas, vLLM's --enable-expert-parallel: each GPU
holds E/ep whole experts; attention and the other weights as without EP): the replicas of
an EP group step together (sim.serving.engine), and the routed experts are priced for
the group (`expert_parallel_parts`): with N new tokens in the group's step, each GPU runs
N k / ep routed token copies (uniform routing, in expectation) through its E/ep experts,
2 x N k / ep x expert parameters FLOPs, reading the experts reached, E/ep (1 - (1 -
k/E)^N); per MoE layer a dispatch and a combine all-to-all over the ep GPUs, each GPU
sending ceil(T / tp) x k x h activations (T: its replica's new tokens, the largest
replica's for the group: the all-to-all waits for it; each TP rank dispatches 1/tp of its
replica's tokens, as DeepEP with DP attention does), then the replica's TP group
all-gathers the layer's outputs (T x h) in place of the MLP's all-reduce.

The achievable fractions are sim.cost's: the device's measured matmul and HBM ceilings
times ATTAINMENT (derived from a training layer; assumed to hold for inference), or the
explicit efficiencies; or, from a calibration profile, the FLOP and byte rates and a fixed
time per layer per step (kernel launches) fitted to real prefill and decode steps
(sim.serving.calibration), the overhead also charged to the output layer.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.topologies import DeviceSpec

from ..cost import compute_fraction, memory_fraction
from .kv_cache import kv_bytes_per_token

CollectiveTime = Callable[[str, float], float]
"""(op, nccl-tests bytes) -> seconds of that collective over the TP (or SP) group; called
once per step, so the caller remembers its answers (sim.serving._Network)."""


@dataclass(frozen=True)
class StepCost:
    """What one GPU of a replica spends per step: time of a batch of sequences, each
    (new tokens, cached tokens before the step). Build with `step_cost`."""

    model: ModelSpec
    tp: int
    flops_per_s: float  # achievable GEMM FLOP/s of one GPU
    bytes_per_s: float  # achievable HBM bytes/s of one GPU
    weight_bytes: float  # bytes per weight element (1 with fp8 weights)
    activation_bytes: float  # bytes per activation element (the dtype's)
    kv_token_layer_bytes: float  # K and V bytes of one token in one layer, one GPU
    collective: CollectiveTime | None  # None with tp = 1
    layers: int  # the layers this pipeline stage holds (all of them without PP)
    first: bool = True  # it holds the embedding
    last: bool = True  # it holds the output layer and samples
    moe_layers: int = 0  # of `layers`, those with experts
    sp: int = 1  # sequence (context) parallel GPUs: a prompt's tokens split over them
    sp_collective: CollectiveTime | None = None  # over the SP group; None with sp = 1
    ep: int = 1  # expert-parallel GPUs: each holds E/ep whole experts
    ep_collective: CollectiveTime | None = None  # over the EP group; None with ep = 1
    overhead: float = 0.0  # s per layer (and output layer) per step: a measured profile's

    @property
    def layer_params(self) -> float:
        """Parameters of a dense layer on one GPU."""
        return self.model.layer_param_count(self.tp, layer=0 if self.model.is_moe else None)

    @property
    def experts_held(self) -> float:
        """Routed experts of a layer one GPU holds: all E (1/tp of each), or E/ep whole."""
        return self.model.num_experts / self.ep

    @property
    def expert_params(self) -> float:
        """Parameters of one routed expert on one GPU: its 1/tp shard, or all of it with
        expert parallelism."""
        m, ep = self.model, self.ep
        if ep > 1:
            return m.layer_expert_param_count(1, ep=ep, etp=1) / self.experts_held
        return m.layer_expert_param_count(self.tp) / m.num_experts

    @property
    def moe_other_params(self) -> float:
        """Parameters of an MoE layer on one GPU other than its routed experts (attention,
        router, shared experts, norms): every token uses them."""
        m = self.model
        return m.layer_param_count(self.tp) - m.layer_expert_param_count(self.tp)

    def kv_bytes_per_token(self) -> float:
        """K and V bytes one GPU of this stage holds per token: its layers, its KV heads,
        1/sp of the positions."""
        return self.kv_token_layer_bytes * self.layers / self.sp

    def experts_touched(self, tokens: int) -> float:
        """Expected routed experts a layer reads for `tokens` tokens, each sent to top-k of
        E experts uniformly at random (an assumption): E (1 - (1 - k/E)^tokens)."""
        e, k = self.model.num_experts, self.model.moe_router_topk
        return e * (1 - (1 - k / e) ** tokens)

    @property
    def output_params(self) -> float:
        return self.model.vocab_size * self.model.hidden_size / self.tp

    def weight_bytes_per_gpu(self) -> float:
        """All weights one GPU holds: its stage's layers, its share of the embedding (first
        stage) and of the output layer (vocab-parallel) and the final norm (last stage)."""
        m = self.model
        params = (self.layers - self.moe_layers) * self.layer_params
        if self.moe_layers:
            params += self.moe_layers * (self.moe_other_params
                                         + self.experts_held * self.expert_params)
        if self.first:
            params += m.embedding_param_count() / self.tp
        if self.last:
            params += m.output_param_count() / self.tp + m.final_norm_param_count()
        return params * self.weight_bytes

    def roofline(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops_per_s, nbytes / self.bytes_per_s)

    def time(self, batch: Sequence[tuple[int, int]]) -> float:
        """Seconds of one step over `batch` = [(new tokens q, cached tokens c)], each
        sequence sampling one token (module docstring)."""
        compute, communication = self.parts(batch)
        return compute + communication

    @staticmethod
    def split(batch: Sequence[tuple[int, int]], sp: int = 1) -> tuple[int, int, float]:
        """(decoding sequences, prompt tokens, new tokens one GPU runs: the prompt's split
        over `sp`) of `batch`."""
        decodes = sum(1 for q, c in batch if q == 1 and c > 0)
        prompt = sum(q for q, _ in batch) - decodes
        return decodes, prompt, prompt / sp + decodes

    def layer_work(self, batch: Sequence[tuple[int, int]]
                   ) -> tuple[tuple[float, float], tuple[float, float]]:
        """((FLOPs, bytes) of a dense layer's GEMMs, (FLOPs, bytes) of a layer's attention)
        on one GPU for `batch` (module docstring)."""
        m, sp = self.model, self.sp
        tokens = self.split(batch, sp)[2]
        head_dim = m.hidden_size // m.num_attention_heads
        pairs = sum(q * c + q * (q + 1) / 2 for q, c in batch)
        attention_flops = 4 * head_dim * (m.num_attention_heads / self.tp) * pairs / sp
        kv_bytes = sum(q + c for q, c in batch) * self.kv_token_layer_bytes / sp
        return ((2 * tokens * self.layer_params, self.layer_params * self.weight_bytes),
                (attention_flops, kv_bytes))

    def head_work(self, rows: int) -> tuple[float, float]:
        """(FLOPs, bytes) of the output layer sampling `rows` tokens on one GPU."""
        return 2 * rows * self.output_params, self.output_params * self.weight_bytes

    def parts(self, batch: Sequence[tuple[int, int]]) -> tuple[float, float]:
        """(compute, communication) seconds of the step `time` prices."""
        if not batch:
            return 0.0, 0.0
        m, sp = self.model, self.sp
        decodes, prompt, tokens = self.split(batch, sp)
        dense, attention = self.layer_work(batch)
        compute = ((self.layers - self.moe_layers) * self.roofline(*dense)
                   + self.layers * (self.roofline(*attention) + self.overhead))
        if self.moe_layers and self.ep > 1:  # the routed experts: expert_parallel_parts
            other = self.moe_other_params
            compute += self.moe_layers * self.roofline(2 * tokens * other,
                                                       other * self.weight_bytes)
        elif self.moe_layers:
            other, expert = self.moe_other_params, self.expert_params
            k = m.moe_router_topk
            compute += self.moe_layers * self.roofline(
                2 * tokens * (other + k * expert),
                (other + self.experts_touched(tokens) * expert) * self.weight_bytes)
        sampled = len(batch)
        if self.last:
            compute += self.roofline(*self.head_work(sampled)) + self.overhead
        act, communication = self.activation_bytes, 0.0
        if self.collective is not None:
            outputs = tokens * m.hidden_size * act
            communication += self.layers * 2 * self.collective("all-reduce", outputs)
            if self.ep > 1:  # MoE layers: the outputs all-gathered, not all-reduced
                communication += self.moe_layers * (self.collective("all-gather", outputs)
                                                    - self.collective("all-reduce", outputs))
            if self.last:
                communication += self.collective("all-gather", sampled * m.vocab_size * act)
        if self.sp_collective is not None:  # per layer: the prompt's K and V to every
            if prompt:                      # shard, decode's partial attention outputs
                communication += self.layers * self.sp_collective(
                    "all-gather", prompt * self.kv_token_layer_bytes)
            if decodes:
                communication += self.layers * self.sp_collective(
                    "all-reduce", decodes * m.hidden_size / self.tp * act)
        return compute, communication

    def expert_parallel_parts(self, member_tokens: Sequence[int]) -> tuple[float, float]:
        """(compute, communication) seconds of the routed experts in one lockstep step of
        an EP group whose replicas run `member_tokens` new tokens each (module
        docstring); (0, 0) without expert parallelism or tokens."""
        total = sum(member_tokens)
        if self.ep == 1 or not self.moe_layers or not total:
            return 0.0, 0.0
        m = self.model
        k, e = m.moe_router_topk, m.num_experts
        touched = self.experts_held * (1 - (1 - k / e) ** total)
        compute = self.moe_layers * self.roofline(
            2 * total * k / self.ep * self.expert_params,
            touched * self.expert_params * self.weight_bytes)
        sent = max(math.ceil(t / self.tp) for t in member_tokens) * k * m.hidden_size
        communication = self.moe_layers * 2 * self.ep_collective(
            "all-to-all", sent * self.activation_bytes)
        return compute, communication


def step_cost(model: ModelSpec, device: DeviceSpec, tp: int, dtype: str,
              quantization: str | None, kv_cache_dtype: str,
              collective: CollectiveTime | None,
              compute_efficiency: float | None = None,
              memory_efficiency: float | None = None, layers: int | None = None,
              first: bool = True, last: bool = True, moe_layers: int | None = None,
              sp: int = 1, sp_collective: CollectiveTime | None = None, ep: int = 1,
              ep_collective: CollectiveTime | None = None,
              measured: tuple[float, float, float] | None = None) -> StepCost:
    """The StepCost of `model` on `device` (module docstring). `dtype`: 'bf16' or 'fp16'
    (activations, and weights unless `quantization` = 'fp8': 1-byte weights, GEMMs at
    the device's fp8 peak); `kv_cache_dtype` 'auto' (the dtype) or 'fp8'; `layers`,
    `first`, `last`, `moe_layers`: a pipeline stage's share (default: the whole model);
    `sp`, `sp_collective`: sequence parallelism and its group's collective time; `ep`,
    `ep_collective`: expert parallelism and its group's; `measured`: (FLOP/s, bytes/s,
    overhead s per layer) fitted to a profile (sim.serving.calibration), in place of the
    device's rates."""
    if model.num_attention_heads % tp:
        raise ConfigError(f"--tensor-parallel-size {tp} must divide the model's "
                          f"{model.num_attention_heads} attention heads")
    kv_heads = model.num_query_groups
    if kv_heads % tp and tp % kv_heads:
        raise ConfigError(f"--tensor-parallel-size {tp} must divide the model's {kv_heads} "
                          f"KV heads or be a multiple of them (vLLM splits them evenly or "
                          f"replicates each over tp / KV heads GPUs)")
    activation = {"bf16": 2, "fp16": 2}[dtype]
    gemm_dtype = "fp8" if quantization == "fp8" else dtype
    weight = 1 if quantization == "fp8" else activation
    kv = 1 if kv_cache_dtype == "fp8" else activation
    if measured is not None:
        flops, hbm, overhead = measured
    else:
        flops = device.peak(gemm_dtype) * compute_fraction(device, gemm_dtype,
                                                           compute_efficiency)
        hbm, overhead = device.hbm_bandwidth * memory_fraction(device, memory_efficiency), 0.0
    per_layer = kv_bytes_per_token(model, kv, tp) / model.num_layers
    return StepCost(model, tp, flops, hbm, weight, activation, per_layer,
                    collective if tp > 1 else None,
                    model.num_layers if layers is None else layers, first, last,
                    model.num_moe_layers if moe_layers is None else moe_layers, sp,
                    sp_collective if sp > 1 else None, ep, ep_collective if ep > 1 else None,
                    overhead)
