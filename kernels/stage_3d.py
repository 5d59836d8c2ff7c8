"""One pipeline stage on a 3D tensor-parallel grid: kernels.stage.StageModule with the
cube's parts (Colossal-AI's VocabParallelEmbedding3D, VocabParallelClassifier3D and
VocabParallelCrossEntropyLoss3D: docs/research/tensor_parallel_nd.md sections 1.3 and
6.3; the layers: kernels.layers_3d), as schedules.tp_3d charges them.

Rank t = i + q j + q^2 k of the cube (kernels.linear_nd.Grid3D):
- word embedding (and untied output layer), (V, h): holds vocabulary block j q + i of q^2
  (V/q^2 rows) by hidden block k. The lookup all-gathers the table over 'tp_weight'
  (vocabulary block j of q), takes the ids of samples block i of q, zeros those of other
  vocabulary blocks (kernels.vocab_parallel on 'tp_input', whose member j holds block j)
  and reduce-scatters the (b/q, s, h/q) partial sums over 'tp_input' along the batch:
  samples block i q + j by hidden k, the layers' activation block. Backward: the output
  gradient all-gathered over 'tp_input', the table's gradient reduce-scattered over
  'tp_weight'.
- learned position table (s, h): hidden block k, replicated on 'tp_input_weight' (its
  gradient all-reduced there).
- head: the final norm, then logits = X E^T as a 3D product with QKV's roles: X
  all-gathered over 'tp_input' (samples block i), E over 'tp_weight' (vocabulary block j
  by hidden k, used transposed: the same gathered operand as Linear3D's W block, from a
  table split by vocabulary rows, so a tied embedding serves as it is), the partial
  logits reduce-scattered over 'tp_output': (b/q^2, s, V/q), samples block i q + k by
  vocabulary block j.
- loss: vocabulary-parallel cross-entropy over 'tp_input' (3 all-reduces of T/q^2 fp32
  values), the mean over the rank's T/q^2 tokens, then the mean over the q^2 sample
  blocks: one scalar all-reduce over 'tp_output' and one over 'tp_weight', each / q.
Stages send and receive (b/q^2, s, h/q) activation blocks (Grid3D.activation_shape).
Units: token ids int64, logits and loss fp32.
"""
from __future__ import annotations

import torch
from torch import nn

from clustersim.schedules.names import TP_INPUT, TP_INPUT_WEIGHT, TP_OUTPUT, TP_WEIGHT

from .layers import block_parameter
from .layers_3d import CubeNorm, CubeTransformerLayer, cube_vector
from .stage import StageModule
from .stage_2d import GridTable, mean_over
from .summa import sample_rows
from .vocab_parallel import cross_entropy, embedding_partial


class CubeStageModule(StageModule):
    """StageModule (its forward, layer groups and parameter names) on the cube `tp`."""

    def _vocab_table(self) -> nn.Module:
        grid, q = self.tp, self.tp.q
        rows = grid.coord(TP_INPUT) * q + grid.coord(TP_WEIGHT)
        return GridTable(block_parameter((self.spec.vocab_size, self.spec.hidden_size),
                                         "normal",
                                         ((0, rows, q * q), (1, grid.coord(TP_OUTPUT), q))))

    def _position_table(self) -> nn.Module:
        shape = (self.spec.seq_length, self.spec.hidden_size)
        return GridTable(cube_vector(shape, "normal", self.tp, TP_OUTPUT))

    def _layer(self, granularity: str) -> nn.Module:
        return CubeTransformerLayer(self.spec, self.tp, granularity)

    def _norm(self) -> nn.Module:
        return CubeNorm(self.spec, self.tp, "head")

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (b, s) -> this rank's activation block (b/q^2, s, h/q)."""
        axes, q = self.tp.axes, self.tp.q
        table = axes[TP_WEIGHT].gather(self.word_embeddings.weight, "embedding", 0)
        ids = sample_rows(tokens, (self.tp.coord(TP_WEIGHT), q))
        x = axes[TP_INPUT].scatter(embedding_partial(ids, table, axes[TP_INPUT]),
                                   "embedding", 0)
        if hasattr(self, "position_embeddings"):
            x = x + axes[TP_INPUT_WEIGHT].enter(self.position_embeddings.weight, "embedding")
        return x

    def _head(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Final norm, output layer and the mean cross-entropy over the micro-batch
        `labels` (b, s) (module docstring)."""
        grid, axes, q = self.tp, self.tp.axes, self.tp.q
        rows = axes[TP_INPUT].gather(self.final_norm(x), "head", 0)
        table = axes[TP_WEIGHT].gather(self._head_weight(), "head", 0)
        logits = axes[TP_OUTPUT].scatter(torch.matmul(rows, table.t()), "head", 0).float()
        mine = sample_rows(labels, (grid.coord(TP_WEIGHT) * q + grid.coord(TP_OUTPUT), q * q))
        loss = cross_entropy(logits.reshape(-1, logits.shape[-1]), mine.reshape(-1),
                             axes[TP_INPUT])
        return mean_over(mean_over(loss, axes[TP_OUTPUT]), axes[TP_WEIGHT])
