"""Serving an LLM on the simulated cluster (issue 21): requests (`workload`), the KV cache
(`kv_cache`), the time of one engine step (`step_cost`; its rates fitted to measured
steps by `calibration`), replicas and their batching policy on SimPy (`engine`), and
vLLM's metrics (`metrics`); `search` runs layouts side by side. `simulate_serving` ties
them together from names, as `clustersim serve` does.

Modelled: data-parallel replicas of `sp` sequence-parallel shards of `pp` pipeline stages
of a tensor-parallel group each, on the topology's GPUs in order (replica r, shard j,
stage s on GPUs ((r sp + j) pp + s) tp .. + tp - 1; all alike: TP and SP collectives
priced on replica 0's first groups, stage-to-stage sends on its GPUs); bf16/fp16 models
with optional fp8 weights (`quantization='fp8'`) and fp8 KV cache; MoE models with their
experts sharded over the TP group, or with expert parallelism over `ep` GPUs (ep/tp
consecutive replicas stepping together, their all-to-alls priced on the first group's
GPUs); static, continuous, chunked-prefill and disaggregated (prefill and decode
replicas, the KV cache moved between them on the flow network) batching; recompute or
swap preemption (KV blocks over each GPU's PCIe link to host memory). Refused with
the reason: expert parallelism with pipeline or sequence parallelism or disaggregation
(not modelled).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx
import simpy

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.profile import Profile
from clustersim.topologies import get_device, gpu_nodes, load_topology

from ..collectives import run_collective
from ..flows import FlowNetwork
from ..link_capacity import PCIE_EFFICIENCY
from ..offload import pcie_rate
from .calibration import fit_serving
from .engine import POLICIES, Limits, ServingRun, Swap, serve
from .kv_cache import GPU_MEMORY_UTILIZATION, KvCapacity, activation_reserve, kv_capacity
from .metrics import SLO_KEYS, metrics
from .step_cost import StepCost, step_cost
from .workload import Request, check_context, load_trace, synthetic

__all__ = ["simulate_serving", "ServingResult", "Limits", "Request", "synthetic",
           "load_trace", "POLICIES", "SWAP_SPACE_GIB"]

DTYPES = {"auto": "bf16", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16",
          "float16": "fp16", "half": "fp16"}
SWAP_SPACE_GIB = 4  # vLLM's default --swap-space, GiB of host memory per GPU
KV_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}


@dataclass
class ServingResult:
    """A simulated serving run: vLLM's `metrics`, the `run` behind them, the KV
    `capacity` of the fullest GPU, the first stage's step `cost` (every stage's in
    `stage_costs`), and what was assumed (`notes`)."""

    metrics: dict
    run: ServingRun
    capacity: KvCapacity
    cost: StepCost
    notes: list[str]
    stage_costs: list[StepCost]


def stage_layers(model: ModelSpec, pp: int) -> list[int]:
    """Layers per pipeline stage: as even as can be, the first stages one more where they
    do not divide (an assumption; vLLM's split is also even)."""
    base, extra = divmod(model.num_layers, pp)
    return [base + (stage < extra) for stage in range(pp)]


class _Network:
    """Seconds of one collective (or P2P send) over given GPUs of `graph`, alone on the
    network (sim.collectives: NCCL's choice on CUDA GPUs), remembered per call."""

    def __init__(self, graph: nx.DiGraph):
        self.graph = graph
        self.seconds = lru_cache(maxsize=None)(self._seconds)

    def _seconds(self, op: str, gpus: tuple[str, ...], nbytes: float) -> float:
        env = simpy.Environment()
        done = run_collective(env, FlowNetwork(env, self.graph), op, list(gpus), nbytes)
        env.run()
        return done.value.time_s


def _check_expert_parallel(model: ModelSpec, ep: int, tp: int, dp: int, pp: int, sp: int,
                           batching: str) -> None:
    """Refuse an expert-parallel layout the model does not have or the simulator does not
    model, naming the rule."""
    if not model.is_moe:
        raise ConfigError(f"ep {ep}: the model has no experts (num_experts unset)")
    if ep % tp or dp % (ep // tp):
        raise ConfigError(f"ep must be tensor_parallel_size x a divisor of dp (its replicas "
                          f"step together), got ep {ep} with tp {tp} and dp {dp}")
    if model.num_experts % ep:
        raise ConfigError(f"ep {ep} must divide the model's {model.num_experts} experts")
    if pp > 1 or sp > 1 or batching == "disaggregated":
        raise ConfigError("expert parallelism with pipeline or sequence parallelism or "
                          "disaggregated batching is not modelled")


def _choice(name: str, value: str, table: dict) -> str:
    key = str(value).strip().lower()
    if key not in table:
        raise ConfigError(f"{name} must be one of {', '.join(table)}, got {value!r}")
    return table[key]


def simulate_serving(model: ModelSpec, topology: str | nx.DiGraph,
                     requests: Sequence[Request], tp: int = 1, dp: int = 1, pp: int = 1,
                     sp: int = 1,
                     dtype: str = "auto", quantization: str | None = None,
                     kv_cache_dtype: str = "auto", batching: str = "continuous",
                     limits: Limits = Limits(),
                     gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                     compute_efficiency: float | None = None,
                     memory_efficiency: float | None = None,
                     slo: Mapping[str, float] | None = None,
                     prefill_replicas: int = 0, ep: int = 1,
                     profile: Profile | None = None, preemption_mode: str = "recompute",
                     swap_space_gib: float = SWAP_SPACE_GIB) -> ServingResult:
    """Serve `requests` with `dp` replicas of `model` at tensor parallelism `tp` on
    `topology` (module docstring); `slo`: {'ttft' | 'tpot' | 'e2el': ms} for
    request_goodput; `prefill_replicas`: with batching='disaggregated', how many of the dp
    replicas prefill (the others decode); `ep`: expert-parallel GPUs (a multiple of tp,
    ep/tp replicas per group; vLLM's --enable-expert-parallel is ep = tp x dp);
    `profile`: a calibration profile with serving steps, whose fitted rates replace the
    device's (sim.serving.calibration); `preemption_mode` 'recompute' or 'swap' (vLLM V0's,
    with `swap_space_gib` GiB of host memory per GPU; continuous batching only). A request
    whose prompt and output exceed the model's context (`seq_length`, vLLM's
    max_model_len) is refused, as vLLM's server does; raises ConfigError naming the bad
    setting."""
    for name, value in (("tensor_parallel_size", tp), ("dp", dp), ("pipeline_parallel_size",
                                                                     pp), ("sp", sp),
                        ("ep", ep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if pp > model.num_layers:
        raise ConfigError(f"pipeline_parallel_size {pp} exceeds the model's "
                          f"{model.num_layers} layers")
    if batching not in POLICIES:
        raise ConfigError(f"batching must be one of {', '.join(POLICIES)}, got {batching!r}")
    if (batching == "disaggregated") != bool(prefill_replicas):
        raise ConfigError("prefill_replicas (--num-prefill-replicas) and disaggregated "
                          "batching go together: give both or neither")
    if batching == "disaggregated" and not 1 <= prefill_replicas < dp:
        raise ConfigError(f"num_prefill_replicas must be from 1 to dp - 1 = {dp - 1} (the "
                          f"other replicas decode), got {prefill_replicas}")
    if ep > 1:
        _check_expert_parallel(model, ep, tp, dp, pp, sp, batching)
    if preemption_mode not in ("recompute", "swap"):
        raise ConfigError(f"preemption_mode must be recompute or swap, got "
                          f"{preemption_mode!r}")
    if not (isinstance(swap_space_gib, (int, float)) and 0 < swap_space_gib < math.inf):
        raise ConfigError(f"swap_space must be a number of GiB > 0, got {swap_space_gib!r}")
    if quantization not in (None, "fp8"):
        raise ConfigError(f"quantization must be fp8 or none, got {quantization!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got "
                          f"{gpu_memory_utilization!r}")
    if batching == "static" and limits.batch_size is None:
        raise ConfigError("static batching needs batch_size (--batch-size)")
    if batching != "static" and limits.max_num_batched_tokens < limits.max_num_seqs:
        raise ConfigError(f"max_num_batched_tokens {limits.max_num_batched_tokens} must be at "
                          f"least max_num_seqs {limits.max_num_seqs} (every running sequence "
                          f"takes a token per step; vLLM's SchedulerConfig refuses it too)")
    if batching == "static" and (limits.max_num_seqs, limits.max_num_batched_tokens) != (
            Limits.max_num_seqs, Limits.max_num_batched_tokens):
        raise ConfigError("max_num_seqs and max_num_batched_tokens: static batching runs "
                          "batch_size sequences per step and prefills their prompts in one: "
                          "they would change nothing")
    if batching != "static" and limits.batch_size is not None:
        raise ConfigError("batch_size (--batch-size) sets static batches: give "
                          "--batching static, or --max-num-seqs for continuous batching")
    for key, limit in (slo or {}).items():
        if key not in SLO_KEYS or not (isinstance(limit, (int, float)) and limit > 0):
            raise ConfigError(f"goodput: an SLO is one of {', '.join(SLO_KEYS)} with a limit "
                              f"> 0 ms, got {key}:{limit!r}")
    check_context(requests, model.seq_length)
    act = _choice("dtype", dtype, DTYPES)
    measured = None
    if profile is not None:
        given = [name for name, value in (("quantization", quantization),
                                          ("compute_efficiency", compute_efficiency),
                                          ("memory_efficiency", memory_efficiency)) if value]
        if given:
            raise ConfigError(f"the profile's measured rates price the steps: "
                              f"{', '.join(given)} would change nothing (or measure fp8)")
        rates = fit_serving(profile, model, act)
        measured = (rates.flops_per_s, rates.bytes_per_s, rates.overhead)
    kv = _choice("kv_cache_dtype", kv_cache_dtype, KV_DTYPES)
    graph = load_topology(topology) if not isinstance(topology, nx.DiGraph) else topology
    gpus = gpu_nodes(graph)
    if tp * pp * sp * dp > len(gpus):
        raise ConfigError(f"tensor_parallel_size x pipeline_parallel_size x sp x dp = "
                          f"{tp * pp * sp * dp} GPUs, but the topology has {len(gpus)}")
    device = get_device(graph.nodes[gpus[0]]["device"])

    network = _Network(graph)

    def gpu(replica: int, shard: int = 0, stage: int = 0, rank: int = 0) -> str:
        """The GPU of a replica's shard, stage and TP rank (module docstring's layout)."""
        return gpus[((replica * sp + shard) * pp + stage) * tp + rank]

    tp_group = tuple(gpu(0, rank=g) for g in range(tp))  # replica 0's first groups
    sp_group = tuple(gpu(0, shard=j) for j in range(sp))
    ep_group = tuple(gpu(r, rank=g) for r in range(ep // tp) for g in range(tp))

    def collective(op: str, nbytes: float) -> float:
        return network.seconds(op, tp_group, nbytes)

    def sp_collective(op: str, nbytes: float) -> float:
        return network.seconds(op, sp_group, nbytes)

    def ep_collective(op: str, nbytes: float) -> float:
        return network.seconds(op, ep_group, nbytes)

    split, costs = stage_layers(model, pp), []
    for stage, layers in enumerate(split):
        first_layer = sum(split[:stage])
        moe = sum(model.is_moe_layer(i) for i in range(first_layer, first_layer + layers))
        costs.append(step_cost(model, device, tp, act, quantization, kv, collective,
                               compute_efficiency, memory_efficiency, layers, stage == 0,
                               stage == pp - 1, moe, sp, sp_collective, ep, ep_collective,
                               measured))
    if batching == "static":  # the largest forward: a whole batch's prompts at once
        forward_seqs = limits.batch_size
        forward_tokens = forward_seqs * max(r.input_tokens for r in requests)
    else:
        forward_seqs, forward_tokens = limits.max_num_seqs, limits.max_num_batched_tokens
    reserve = activation_reserve(model, tp, forward_tokens, forward_seqs,
                                 costs[0].activation_bytes)
    capacity = min((kv_capacity(device.memory_bytes, c.weight_bytes_per_gpu(), reserve,
                                c.kv_bytes_per_token(), gpu_memory_utilization)
                    for c in costs), key=lambda cap: cap.blocks)
    activations = model.hidden_size * costs[0].activation_bytes  # bytes per token

    def stage_send(stage: int, tokens: int) -> float:  # replica 0's stage to the next
        return network.seconds("p2p", (gpu(0, stage=stage), gpu(0, stage=stage + 1)),
                               tokens * activations)

    def kv_transfer(src: int, dst: int, tokens: int) -> float:
        # every GPU moves its own KV to its peer in parallel: the first stage's, fullest
        return network.seconds("p2p", (gpu(src), gpu(dst)),
                               tokens * costs[0].kv_bytes_per_token())

    swap = None
    if preemption_mode == "swap":  # each GPU copies its share over its own PCIe link
        swap = Swap(math.floor(swap_space_gib * 2 ** 30 / capacity.block_bytes),
                    capacity.block_bytes / (pcie_rate(device.name) * PCIE_EFFICIENCY))
    run = serve(requests, costs, capacity.blocks, dp, batching, limits, stage_send,
                prefill_replicas, kv_transfer, swap)
    notes = [f"assumed: activation reserve {reserve / 1e9:.2f} GB per GPU (one forward of "
             f"{forward_tokens} tokens; vLLM profiles it)",
             "not modelled: host scheduling and sampling time, kernel launch gaps, "
             "embedding and elementwise kernels"]
    if profile is not None:
        notes.append(f"compute from the profile's serving steps ({profile.device}): "
                     f"{rates.flops_per_s / 1e12:.3g} TFLOP/s, {rates.bytes_per_s / 1e9:.3g} "
                     f"GB/s, {rates.overhead * 1e6:.3g} us per layer per step, fitted "
                     f"(worst point {rates.worst_error():.0%} off; "
                     f"`clustersim calibrate --serving` prints each)")
    if swap is not None:
        notes.append(f"assumed: swap copies over each GPU's own PCIe x16 link at "
                     f"{capacity.block_bytes / swap.seconds_per_block / 1e9:.3g} GB/s (its "
                     f"rate x NCCL's PCIe efficiency {PCIE_EFFICIENCY}), {swap.blocks:,} "
                     f"blocks of host swap space per GPU")
    if ep > 1:
        notes.append(f"assumed: tokens routed uniformly over the {model.num_experts} experts "
                     f"(an expert-parallel GPU's load is the mean; real routers are skewed)")
    return ServingResult(metrics(run, slo), run, capacity, costs[0], notes, costs)
