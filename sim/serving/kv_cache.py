"""The KV cache of a serving replica: its bytes per token, its capacity in paged blocks,
and the block pool the scheduler allocates from. Units: bytes, tokens, blocks.

- Bytes per token (the whole model): 2 (K and V) x layers x KV heads x head dim x bytes
  per element (Llama 2 7B in fp16: 2 x 32 x 32 x 128 x 2 = 512 KiB). A GPU of a
  tensor-parallel group of `tp` holds max(1, kv_heads // tp) of the KV heads (vLLM
  replicates a KV head over the ranks when tp exceeds their number).
- Capacity per GPU, as vLLM sizes it (gpu_memory_utilization, default 0.9, of the device
  memory, less what the weights and a profiled forward pass take): here
  memory x utilization - the GPU's weights - `activation_reserve`, in blocks of
  BLOCK_TOKENS tokens (vLLM's default block size). The activation reserve is an
  assumption (vLLM measures it): the largest layer's intermediates of one forward of
  `max_num_batched_tokens` tokens, T x (2h + (h + 2 h_kv)/tp + 2f/tp) x activation
  bytes, plus the sampled sequences' fp32 logits, S x vocab x 4.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec

BLOCK_TOKENS = 16  # vLLM's default --block-size
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads one GPU of a TP group of `tp` holds (replicated when tp > KV heads; tp
    divides the KV heads or is a multiple of them: sim.serving.step_cost checks it)."""
    return max(1, model.num_query_groups // tp)


def kv_bytes_per_token(model: ModelSpec, kv_element_bytes: float, tp: int = 1) -> float:
    """K and V bytes of one token on one GPU of the TP group (all layers); tp=1: the model's
    2 x layers x kv_heads x head_dim x bytes."""
    head_dim = model.hidden_size // model.num_attention_heads
    return 2 * model.num_layers * kv_heads_per_gpu(model, tp) * head_dim * kv_element_bytes


def activation_reserve(model: ModelSpec, tp: int, max_num_batched_tokens: int,
                       max_num_seqs: int, activation_bytes: float) -> float:
    """Bytes kept for one forward pass's intermediates (module docstring; an assumption)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    per_token = 2 * h + (h + 2 * model.kv_hidden_size) / tp + 2 * f / tp
    return (max_num_batched_tokens * per_token * activation_bytes
            + max_num_seqs * model.vocab_size * 4)


@dataclass(frozen=True)
class KvCapacity:
    """How a GPU's memory divides (bytes), and the blocks of KV cache that are left."""

    memory: float
    usable: float
    weights: float
    activations: float
    block_bytes: float

    @property
    def blocks(self) -> int:
        return max(0, math.floor((self.usable - self.weights - self.activations)
                                 / self.block_bytes))


def kv_capacity(memory_bytes: float, weight_bytes: float, reserve: float,
                bytes_per_token: float, utilization: float = GPU_MEMORY_UTILIZATION
                ) -> KvCapacity:
    """A GPU's KV capacity (module docstring); ConfigError when no block fits."""
    capacity = KvCapacity(memory_bytes, memory_bytes * utilization, weight_bytes, reserve,
                          BLOCK_TOKENS * bytes_per_token)
    if capacity.blocks < 1:
        raise ConfigError(
            f"no memory left for the KV cache: {utilization:g} x {memory_bytes / 1e9:.1f} GB "
            f"per GPU holds {weight_bytes / 1e9:.1f} GB of weights and {reserve / 1e9:.1f} GB "
            f"of activations: raise --tensor-parallel-size, or lower --max-num-batched-tokens")
    return capacity


def blocks_for(tokens: int) -> int:
    """Blocks a sequence of `tokens` tokens occupies."""
    return -(-tokens // BLOCK_TOKENS)


class BlockPool:
    """The free blocks of one replica (each GPU of its TP group holds the same blocks)."""

    def __init__(self, total: int):
        self.total, self.free = total, total

    @property
    def used_fraction(self) -> float:
        return 1 - self.free / self.total

    def take(self, blocks: int) -> bool:
        """Take `blocks` if that many are free (True), else take none (False)."""
        if blocks > self.free:
            return False
        self.free -= blocks
        return True

    def give(self, blocks: int) -> None:
        self.free += blocks
        if self.free > self.total:
            raise AssertionError(f"{self.free} free blocks of {self.total}")
