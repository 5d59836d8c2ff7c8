"""Vocabulary-parallel embedding lookup and cross-entropy (Megatron-LM: Shoeybi et al.
2019, section 3; `VocabParallelEmbedding`, `_VocabParallelCrossEntropy`).

The (V, h) word embedding (and the output layer) is split by rows: TP rank r holds token
ids [r*V/t, (r+1)*V/t). The lookup gathers the rows this rank holds and zeros the others
(a partial sum that the caller all-reduces, or reduce-scatters along the sequence with
sequence parallelism). The cross-entropy of vocab-sharded logits needs no logits gather:
an all-reduce of the per-token max (numerical stability), of the target logit (held by
one rank) and of the sum of exponentials, each b*s fp32 values; its backward is local
(softmax - one-hot on this rank's columns). At tp = 1 both are torch's own functions.
Units: token ids (int64), logits fp32.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .tensor_parallel import TensorParallel


def vocab_range(rows: int, tp: TensorParallel) -> tuple[int, int]:
    """[first, last) token ids of this rank's shard of `rows` (the local row count)."""
    return tp.rank * rows, (tp.rank + 1) * rows


def _local_ids(ids: torch.Tensor, rows: int, tp: TensorParallel
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids shifted into this shard with foreign ids set to 0, mask of foreign ids)."""
    lo, hi = vocab_range(rows, tp)
    foreign = (ids < lo) | (ids >= hi)
    return (ids - lo).masked_fill(foreign, 0), foreign


def embedding_partial(ids: torch.Tensor, weight: torch.Tensor, tp: TensorParallel
                      ) -> torch.Tensor:
    """Rows of this rank's vocab shard `weight` (V/t, h) for `ids` (b, s), zero where an
    id is another rank's: summed over TP this is the full lookup."""
    if not tp.active:
        return F.embedding(ids, weight)
    local, foreign = _local_ids(ids, weight.shape[0], tp)
    return F.embedding(local, weight).masked_fill(foreign.unsqueeze(-1), 0.0)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, tp: TensorParallel
                  ) -> torch.Tensor:
    """Mean cross-entropy over tokens of `logits` (N, V/t) fp32 sharded by vocabulary
    and `labels` (N,) global token ids."""
    if not tp.active:
        return F.cross_entropy(logits, labels)
    return _VocabParallelCrossEntropy.apply(logits, labels, tp).mean()


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss log(sum_j exp z_j) - z_label over the vocab shards of the group."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor,
                tp: TensorParallel) -> torch.Tensor:
        top = tp.all_reduce(logits.max(dim=-1).values, "loss", dist.ReduceOp.MAX)
        shifted = logits - top.unsqueeze(-1)
        local, foreign = _local_ids(labels, logits.shape[-1], tp)
        target = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(foreign, 0.0)
        target = tp.all_reduce(target, "loss")
        exp = shifted.exp()
        total = tp.all_reduce(exp.sum(dim=-1), "loss")
        softmax = exp.div_(total.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, foreign)
        return total.log() - target

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        softmax, local, foreign = ctx.saved_tensors
        out = softmax.clone()
        rows = torch.arange(out.shape[0], device=out.device)
        out[rows, local] -= (~foreign).to(out.dtype)
        return out * grad.unsqueeze(-1), None, None
