"""One pipeline stage (model chunk) of a ModelSpec as a torch module, and the token batch.

Split: the plan's (Plan.stage_layers, schedules.pipeline_split), contiguous layers per
stage; stage 0 also holds the word embedding (+ learned absolute positions), the last
stage the final norm, the output layer and the cross-entropy loss.
With tied embeddings (Megatron's default) the last stage keeps its own copy of the word
embedding under the same name, `word_embeddings.weight`; the true gradient of the shared
weight is the sum of the copies' gradients (Megatron all-reduces them over its embedding
group: kernels.tied_embedding, before an OPT_STEP; without a step
`kernels.results.gather_grads` sums them by name).

Layer groups (`Op.chunk`, schedules.layer_groups): `forward(x, labels, chunk, groups)`
runs one group of the stage's layers, the embedding with group 0 of stage 0 and the head
with the last group of the last stage; `chunk_parameters` lists what a group uses.

Parameter names are global (`layers.5.mlp.fc1.weight`), so a stage's parameters are
named exactly as in the single-stage reference model. Tokens are int64 ids; the loss is
the mean cross-entropy over the micro-batch's b*s tokens (fp32 logits).

Tensor parallelism (`tp`, kernels.tensor_parallel): the word embedding and the output
layer are split by vocabulary rows (kernels.vocab_parallel: masked lookup then all-reduce,
or reduce-scatter along the sequence with SP; vocab-parallel cross-entropy), the layers
by heads and FFN columns. With sequence parallelism a stage's input and output
activation is this rank's sequence shard (b, s/t, h), as Megatron sends it between stages.
On a 2D grid (`tp` a kernels.summa.SummaGrid, tp_mode '2d') the stage is
kernels.stage_2d's GridStageModule (build_stages' `module_class`): the same forward, names
and layer groups, with the grid's parts (`_vocab_table`, `_position_table`, `_layer`,
`_norm`, `_embed`, `_head`).

Activation recomputation (`recompute`, a schedules.recompute.Recompute of the run's
ParallelConfig; kernels.layers `checkpointed`): 'full' runs the layers a checkpoint
covers under one checkpoint (Megatron-Core's TransformerBlock: method 'uniform' one
checkpoint per N consecutive layers of the stage, 'block' one per layer for its first N
layers and none for the rest), so a checkpoint keeps only its input and the backward
reruns its forward, TP/SP collectives included; a layer group that starts inside a
uniform chunk starts a checkpoint of its own. 'selective' checkpoints the core attention
of each layer (kernels.layers.CoreAttention). The
embedding, the final norm, the output layer and the loss are never recomputed (as in
Megatron). The single-process reference runs 'none': recomputation must not change a
gradient.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from clustersim.schedules.chains import StageChains
from clustersim.schedules.layer_groups import chunk_parts
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.recompute import INSIDE, KEPT, Recompute

from .layers import (Norm, TransformerLayer, check_recompute, checkpointed, init_parameters,
                     seed_for, sharded_parameter, torch_dtype)
from .tensor_parallel import TensorParallel, replicated_in_sequence
from .vocab_parallel import cross_entropy, embedding_partial


def stage_split(spec: ModelSpec, num_stages: int,
                split: Sequence[int] | None) -> tuple[int, ...]:
    """Layers per stage: `split` (the plan's pipeline split, Plan.stage_layers), or, for
    the whole model as one stage, None."""
    if split is None:
        if num_stages != 1:
            raise ValueError(f"{num_stages} stages need their split (Plan.stage_layers)")
        split = [spec.num_layers]
    if len(split) != num_stages or sum(split) != spec.num_layers:
        raise ValueError(f"split {list(split)} must give {num_stages} stages "
                         f"{spec.num_layers} layers")
    return tuple(split)


class Embedding(nn.Module):
    """A (rows, h) lookup table, normal(0, 0.02) init; rows split over `tp_size` ranks
    when vocab-parallel."""

    def __init__(self, rows: int, hidden: int, tp_size: int = 1):
        super().__init__()
        self.weight = sharded_parameter((rows, hidden), "normal", tp_size,
                                        0 if tp_size > 1 else None)


class StageModule(nn.Module):
    """Stage `stage` of `num_stages`: forward(x, labels) maps token ids (stage 0) or the
    previous stage's activation (b, s, h) to this stage's activation, or, on the last
    stage, to the scalar mean loss over the micro-batch. `recompute`: a Recompute, or
    'none', 'selective' or 'full' (uniform, one layer per checkpoint; module docstring)."""

    def __init__(self, spec: ModelSpec, stage: int, num_stages: int,
                 tp: TensorParallel | None = None, split: Sequence[int] | None = None,
                 recompute: Recompute | str = "none"):
        super().__init__()
        self.tp = tp = tp if tp is not None else TensorParallel()
        if not 0 <= stage < num_stages:
            raise ValueError(f"stage={stage} out of range 0..{num_stages - 1}")
        self.spec, self.stage, self.num_stages = spec, stage, num_stages
        self.split = stage_split(spec, num_stages, split)
        self.first, self.last = stage == 0, stage == num_stages - 1
        if isinstance(recompute, str):
            recompute = Recompute.named(check_recompute(recompute))
        self.recompute = recompute
        tied = not spec.untie_embeddings_and_output_weights
        if self.first or (self.last and tied):
            self.word_embeddings = self._vocab_table()
        if self.first and spec.position_embedding_type == "learned_absolute":
            self.position_embeddings = self._position_table()
        self.layers = nn.ModuleDict({
            str(i): self._layer(recompute.granularity)
            for i in chunk_parts(self.split, stage, None, 1).layers})
        if self.last:
            self.final_norm = self._norm()
            if not tied:
                self.output_layer = self._vocab_table()  # (V, h) projection, no bias

    # --- the parts, under Megatron's 1D TP (kernels.stage_2d: on a 2D grid) -----------
    def _vocab_table(self) -> nn.Module:
        """The (V, h) word embedding or output layer, rows split over TP."""
        return Embedding(self.spec.vocab_size, self.spec.hidden_size, self.tp.size)

    def _position_table(self) -> nn.Module:
        """The learned (s, h) position embedding, replicated."""
        table = Embedding(self.spec.seq_length, self.spec.hidden_size)
        replicated_in_sequence(table.weight)
        return table

    def _layer(self, granularity: str) -> nn.Module:
        return TransformerLayer(self.spec, self.tp, granularity)

    def _norm(self) -> nn.Module:
        return Norm(self.spec)

    def _parts(self, chunk: int | None, groups: int) -> tuple[bool, list[str], bool]:
        """(runs the embedding, layer keys, runs the head) of layer group `chunk`
        (schedules.layer_groups.chunk_parts)."""
        parts = chunk_parts(self.split, self.stage, chunk, groups)
        return parts.embedding, [str(i) for i in parts.layers], parts.head

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None,
                chunk: int | None = None, groups: int = 1) -> torch.Tensor:
        """The stage (chunk None) or its layer group `chunk` of `groups`: token ids or an
        activation (b, s, h) in, an activation or (with the head) the mean loss out."""
        embed, keys, head = self._parts(chunk, groups)
        if embed:
            x = self._embed(x)
        for checkpoint, region in self._regions(keys):
            run = nn.Sequential(*(self.layers[key] for key in region))
            x = checkpointed(run, x) if checkpoint else run(x)
        if not head:
            return x
        if labels is None:
            raise ValueError(f"stage {self.stage} is the last stage: it needs labels")
        return self._head(x, labels)

    def _head(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Final norm, output layer and the mean cross-entropy over the micro-batch."""
        x = self.tp.enter(self.final_norm(x), "head")
        logits = F.linear(x, self._head_weight()).float()
        return cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), self.tp)

    def _regions(self, keys: list[str]) -> list[tuple[bool, list[str]]]:
        """The layers `keys` as runs of (under one checkpoint?, layer keys), in order."""
        first = sum(self.split[:self.stage])  # global index of the stage's first layer
        regions: list[tuple[bool, list[str]]] = []
        for key in keys:
            role = self.recompute.role(int(key) - first)
            if role == INSIDE and regions and regions[-1][0]:
                regions[-1][1].append(key)
            elif role == KEPT and regions and not regions[-1][0]:
                regions[-1][1].append(key)
            else:
                regions.append((role != KEPT, [key]))
        return regions

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (b, s) -> (b, s, h), or this rank's sequence shard with SP."""
        x = self.tp.exit(embedding_partial(tokens, self.word_embeddings.weight, self.tp),
                         "embedding")
        if hasattr(self, "position_embeddings"):
            x = x + self.position_embeddings.weight[self.tp.sequence_slice(tokens.shape[1])]
        return x

    def _head_weight(self) -> nn.Parameter:
        head = self.output_layer if hasattr(self, "output_layer") else self.word_embeddings
        return head.weight

    def chunk_parameters(self, chunk: int | None, groups: int) -> list[tuple[str, nn.Parameter]]:
        """(global name, parameter) that layer group `chunk` computes with, in module
        order (a tied word embedding appears in both the embedding and the head group)."""
        embed, keys, head = self._parts(chunk, groups)
        wanted = {"layers." + k + "." for k in keys}
        out = []
        for name, p in self.named_parameters():
            root = name.split(".", 1)[0]
            if (name.startswith(tuple(wanted))
                    or (embed and root in ("word_embeddings", "position_embeddings"))
                    or (head and root in ("final_norm", "output_layer"))
                    or (head and root == "word_embeddings" and p is self._head_weight())):
                out.append((name, p))
        return out


def build_stages(spec: ModelSpec, stages: list[int], num_stages: int, seed: int,
                 device: torch.device | str = "cpu", tp: TensorParallel | None = None,
                 split: Sequence[int] | None = None, recompute: Recompute | str = "none",
                 chains: StageChains | None = None,
                 module_class: type[StageModule] | None = None) -> dict[int, StageModule]:
    """The modules of the stages one rank holds (its TP shard: `tp`; layers per stage:
    `split`, see stage_split; activation `recompute`), initialised from `seed` and placed
    on `device` in the model dtype, each a `module_class` (StageModule by default; on a
    2D grid kernels.stage_2d.GridStageModule, which kernels.stage_2d.stage_class picks).
    With several stage `chains` (DualPipe's directions, schedules.chains) virtual stage s
    is a copy of model stage chains.model_stage(s), of the same name and initial values.
    When the rank holds both the first and the last stage of a tied model, the two share
    one word-embedding module (as one model would)."""
    modules = {}
    if chains is not None and chains.chains > 1:
        num_stages, split = chains.length, None if split is None else split[:chains.length]
    module_class = module_class or StageModule
    for s in stages:
        model_stage = s if chains is None else chains.model_stage(s)
        module = module_class(spec, model_stage, num_stages, tp, split, recompute)
        init_parameters(module, seed, module.tp.rank)
        modules[s] = module.to(device=device, dtype=torch_dtype(spec))
    first, last = 0, num_stages - 1
    if (first in modules and last in modules and first != last
            and not spec.untie_embeddings_and_output_weights):
        modules[last].word_embeddings = modules[first].word_embeddings
    return modules


def named_parameters(modules: dict[int, StageModule]) -> dict[str, nn.Parameter]:
    """Global name -> parameter over a rank's stage modules (a shared one listed once)."""
    out: dict[str, nn.Parameter] = {}
    for module in modules.values():
        for name, p in module.named_parameters():
            out.setdefault(name, p)
    return out


def token_batch(spec: ModelSpec, global_batch: int, seed: int,
                device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), each (global_batch, seq_length) int64: random ids drawn from a
    generator seeded by `seed`, labels the inputs shifted by one token."""
    gen = torch.Generator().manual_seed(seed_for(seed, "data"))
    tokens = torch.randint(0, spec.vocab_size, (global_batch, spec.seq_length + 1), generator=gen)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def microbatch_rows(dp_rank: int, microbatch: int, micro_batch_size: int,
                    num_microbatches: int) -> slice:
    """Rows of the global batch that DP replica `dp_rank` uses for `microbatch`: replica d
    owns rows [d*M*b, (d+1)*M*b), microbatch m the m-th b of them."""
    if not 0 <= microbatch < num_microbatches:
        raise IndexError(f"microbatch {microbatch} out of range 0..{num_microbatches - 1}")
    start = (dp_rank * num_microbatches + microbatch) * micro_batch_size
    return slice(start, start + micro_batch_size)
