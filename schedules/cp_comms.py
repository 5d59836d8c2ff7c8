"""Context-parallel communication of one compute op: ring attention or Ulysses.

Context parallelism splits the sequence over the cp ranks (Megatron splits it into 2*cp
chunks for load balance; costs already divide FLOPs and activations by cp). Attention
needs every token's K and V; two ways (`cp_comm`):

- 'ring': ring attention (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise
  Transformers"; Megatron-Core `AttnFuncWithCPAndKVP2P`). Each rank passes its K and V
  block to the next rank, cp-1 steps, each overlapped with the attention of the block it
  holds. Per layer per rank, one KV block is 2 * b*(s/cp)*h_kv*dtype / t bytes (t: the TP
  heads split). Forward moves (cp-1) blocks; backward passes the KV blocks again and the
  dK/dV blocks the other way round the ring, 2(cp-1) blocks. That pattern is a ring
  all-gather of the cp blocks (forward; the KV pass of backward) and a ring reduce-scatter
  (the dKV pass), so the ops are ALL_GATHER / REDUCE_SCATTER on 'cp' of S = cp * block,
  whose ring moves (cp-1)/cp * S = (cp-1) blocks per rank: the closed form. They run
  alongside their compute op (schedules.contract: 'cp' is overlapped), which is
  optimistic where one layer's KV transfer outlasts that layer's attention (it may hide
  behind the MLP of the aggregated op here).
- 'ulysses': DeepSpeed-Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses"): an all-to-all
  turns the sequence-split Q, K, V into head-split ones before attention, and one turns
  the output back after it: per layer, forward an all-to-all of Q,K,V, S = b*(s/cp)*
  (h + 2h_kv)*dtype / t, and one of the output, S = b*(s/cp)*h*dtype / t; backward the
  same two on the gradients. A rank sends (cp-1)/cp * S of each (the paper's 4Nh/P per
  layer for MHA, N = s*b tokens, P = cp). Blocking. The all-to-all splits the heads of
  each of Q, K and V into cp parts (Transformer Engine's flash_attn_a2a_communicate views
  them as [cp, heads // cp]; DeepSpeed-Ulysses likewise), so both the query heads and the
  KV groups of a TP rank must be divisible by cp: ParallelConfig.check_model refuses the
  rest, as KV heads are not replicated over cp ranks here.
- 'usp': USP (Fang & Zhao 2024, arXiv 2405.07719; Megatron-Core's --cp-comm-type
  a2a+p2p, schedules.usp): Ulysses over the cp_a2a ranks of each ring step ('cp_a2a'
  group, blocking), then ring attention over the cp / cp_a2a steps ('cp_ring', alongside)
  on the gathered sequence: each rank then holds b*s/steps tokens of h_kv/cp_a2a KV
  heads, so a KV block is the same 2 * b*(s/cp)*h_kv*dtype / t bytes as ring's and the
  ring moves (steps-1) of them. cp_a2a = cp is Ulysses, cp_a2a = 1 ring attention.
Full recompute repeats the forward's communication in the backward; W needs none.
"""
from __future__ import annotations

from .comm_spec import Comm, Covered, comms
from .model import ModelSpec
from .names import CP, CP_A2A, CP_RING
from .ops import OpKind
from .parallel import ParallelConfig


def cp_comms(model: ModelSpec, parallel: ParallelConfig, cov: Covered,
             cp_comm: str = "ring") -> list[Comm]:
    """The CP collectives of the compute op `cov` describes (module docstring)."""
    cp, t = parallel.cp, parallel.tp
    if cp == 1 or cov.layers == 0:
        return []
    tokens = model.micro_batch_size * model.seq_length / cp
    d, h, hkv = model.dtype_bytes, model.hidden_size, model.kv_hidden_size
    forward, backward = cov.forward_layers, cov.layers * cov.backward
    if cp_comm == "usp":  # Ulysses over cp_a2a ranks, then a ring of the rest
        steps = cp // parallel.cp_a2a
        return (_ulysses(tokens, h, hkv, d, t, forward + backward, CP_A2A)
                + _ring(steps, tokens, hkv, d, t, forward, backward, CP_RING))
    if cp_comm == "ring":
        return _ring(cp, tokens, hkv, d, t, forward, backward, CP)
    return _ulysses(tokens, h, hkv, d, t, forward + backward, CP)


def _ring(steps: int, tokens: float, hkv: float, d: float, t: int, forward: int,
          backward: int, group: str) -> list[Comm]:
    """Ring attention over `steps` ranks: per layer an all-gather of S = steps KV blocks of
    2 * tokens * h_kv * d / t bytes (forward, and the KV pass of backward) and a
    reduce-scatter of S (backward's dKV pass)."""
    ring = steps * 2 * tokens * hkv * d / t  # S: all the group's KV blocks
    passes = forward + backward
    return (comms(OpKind.ALL_GATHER, group, passes * ring, passes)
            + comms(OpKind.REDUCE_SCATTER, group, backward * ring, backward))


def _ulysses(tokens: float, h: float, hkv: float, d: float, t: int, n: int, group: str
             ) -> list[Comm]:
    """Ulysses: per layer pass an all-to-all of Q, K, V, S = tokens * (h + 2 h_kv) * d / t,
    and one of the output, S = tokens * h * d / t."""
    qkv, out = tokens * (h + 2 * hkv) * d / t, tokens * h * d / t
    return (comms(OpKind.ALL_TO_ALL, group, n * qkv, n)
            + comms(OpKind.ALL_TO_ALL, group, n * out, n))
