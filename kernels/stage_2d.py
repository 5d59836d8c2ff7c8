"""One pipeline stage on a 2D tensor-parallel grid: kernels.stage.StageModule with the
grid's parts (Colossal-AI's VocabParallelEmbedding2D, VocabParallelClassifier2D and
VocabParallelCrossEntropyLoss2D: docs/research/tensor_parallel_nd.md section 6.1; the
layers: kernels.layers_2d).

Rank (i, j) of the q x q grid (kernels.summa.SummaGrid):
- word embedding (and untied output layer), (V, h): holds vocabulary block i (V/q rows)
  by hidden block j (h/q). The lookup takes every id of the micro-batch, zeros those of
  other vocabulary blocks (kernels.vocab_parallel) and reduce-scatters the (b, s, h/q)
  partial sums over 'tp_col' along the batch, keeping samples block i (b/q): the layers'
  activation block. Backward: one all-gather of the output gradient over 'tp_col'; the
  table's gradient is local.
- learned position table (s, h): part j q + i of q^2 along the hidden dimension (as a
  norm weight, kernels.layers_2d.grid_vector), all-gathered over 'tp_col' to (s, h/q).
- head: the final norm, then logits = X E^T as one SUMMA product (kernels.summa,
  transposed): (b/q, s, V/q), samples block i by vocabulary block j.
- loss: vocabulary-parallel cross-entropy over 'tp_row' (3 all-reduces of T/q fp32
  values: kernels.vocab_parallel on the row group, whose member j holds vocabulary
  block j), the mean over the rank's T/q tokens, then the mean over the q samples
  blocks: one all-reduce of the scalar over 'tp_col' divided by q; its backward is the
  gradient / q, local (every rank holds the same loss).
Stages send and receive (b/q, s, h/q) activation blocks (SummaGrid.activation_shape).
On a 2.5D grid (kernels.linear_nd.Grid25D) each depth slice dep runs the above on its
samples block dep of d (the lookup takes only those ids; the activation block is samples
block dep q + i of d q), and the loss is the slice's mean: the depth slices' gradients are
averaged with the data-parallel replicas' over 'dp_dep' (schedules.tp_grid), which makes
them the micro-batch mean's.
Units: token ids int64, logits and loss fp32.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.tp_grid import TpGrid

from .layers import block_parameter
from .layers_2d import GridNorm, GridTransformerLayer, gather_vectors, grid_vector
from .stage import StageModule
from .summa import sample_rows, summa_matmul
from .tensor_parallel import TensorParallel
from .vocab_parallel import cross_entropy, embedding_partial


class GridTable(nn.Module):
    """A lookup table's block on this rank, as `weight`."""

    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight


class GridStageModule(StageModule):
    """StageModule (its forward, layer groups and parameter names) on the grid `tp`."""

    def _vocab_table(self) -> nn.Module:
        grid, q = self.tp, self.tp.q
        return GridTable(block_parameter((self.spec.vocab_size, self.spec.hidden_size),
                                         "normal", ((0, grid.row, q), (1, grid.col, q))))

    def _position_table(self) -> nn.Module:
        shape = (self.spec.seq_length, self.spec.hidden_size)
        return GridTable(grid_vector(shape, "normal", self.tp))

    def _layer(self, granularity: str) -> nn.Module:
        return GridTransformerLayer(self.spec, self.tp, granularity)

    def _norm(self) -> nn.Module:
        return GridNorm(self.spec, self.tp, "head")

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (b, s) -> this rank's activation block (b/q, s, h/q; 2.5D
        b/(d q))."""
        col = self.tp.col_group
        tokens = sample_rows(tokens, self.tp.slice_block)  # 2.5D: the depth slice's
        x = col.scatter(embedding_partial(tokens, self.word_embeddings.weight, col),
                        "embedding", 0)
        if hasattr(self, "position_embeddings"):
            x = x + gather_vectors([self.position_embeddings.weight], self.tp, "embedding")
        return x

    def _head(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Final norm, output layer and the mean cross-entropy over the micro-batch
        `labels` (b, s) (module docstring)."""
        grid = self.tp
        logits = summa_matmul(self.final_norm(x), self._head_weight(), grid, "head",
                              transposed=True).float()
        mine = sample_rows(labels, grid.sample_block)
        loss = cross_entropy(logits.reshape(-1, logits.shape[-1]), mine.reshape(-1),
                             grid.row_group)
        return mean_over(loss, grid.col_group)


def mean_over(loss: torch.Tensor, group: TensorParallel) -> torch.Tensor:
    """The mean of the group's (scalar) losses, each the mean over an equal share of the
    tokens: one all-reduce / size forward; backward the gradient / size, local (every
    member holds the same result)."""
    return _MeanOver.apply(loss, group)


class _MeanOver(torch.autograd.Function):
    """mean_over's all-reduce / size forward, gradient / size backward."""

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, group: TensorParallel) -> torch.Tensor:
        ctx.size = group.size
        return group.all_reduce(loss, "loss") / group.size

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad / ctx.size, None


def check_grid_model(model: ModelSpec, grid: TpGrid) -> None:
    """ConfigError unless the vectors cut in q^2 parts divide evenly (Colossal-AI's 2D
    layers assert the same): on 2D the hidden size (norm weights, position table) and,
    with linear biases, every linear's output size; on 2.5D the learned position table's
    hidden size (its norm weights and biases are cut q ways). The q-way splits, and 3D's,
    are ParallelConfig.check_model's (schedules.tp_grid.check_model_grid)."""
    if grid.mode == "3d":
        return
    q, what = grid.q, "each norm weight, bias and position table"
    parts = {"hidden_size": model.hidden_size}
    if grid.mode == "2.5d":
        what = "the learned position table"
        if model.position_embedding_type != "learned_absolute":
            parts = {}
    elif model.add_bias_linear:
        parts.update(ffn_hidden_size=model.ffn_hidden_size,
                     kv_hidden_size=model.kv_hidden_size)
    for name, size in parts.items():
        if size % (q * q):
            raise ConfigError(f"{name}={size} is not divisible by q^2={q * q}: "
                              f"tp_mode={grid.mode!r} cuts {what} in q^2 parts (the "
                              f"kernels do not pad)")
