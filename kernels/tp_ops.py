"""TP collective ops of a rank's program as measured spans, and the SP gradient sum of
each weight-gradient op (a mixin of kernels.executor.RankExecutor).

The IR (schedules.intra_layer) gives each compute op its TP collectives as ops on group
'tp' (on a 2D grid 'tp_row' and 'tp_col': schedules.tp_2d), aggregated per kind and group
(`Op.count` collectives, `nbytes` in total), posted right after the compute op (blocking)
or, when they run beside it (`Op.alongside`: SUMMA's steps 2..q), right before it.
In the kernels those collectives run INSIDE the compute op, where autograd needs them
(kernels.tensor_parallel), and each one is timed there (clock markers around the
blocking call). So a TP op does no work when the program reaches it; its span is built
when the iteration's markers are resolved:
- the op takes the next `count` measured collectives of its kind, group and placement
  (a record's `alongside`) from its compute op (in the order they ran), and its
  duration is the sum of theirs;
- the compute span is shortened by the durations its TP ops took, and the TP spans
  follow it back to back on their group's lane, so per-op compute and TP times compare one to
  one with the simulator's, which runs them in that order. The true interleaving of
  GEMMs and collectives inside the op is not shown (meta['limits'] says so);
- collectives that no op of the program claims (the SP gradient all-reduces of the
  norms, or a program without TP ops) stay inside the compute span; its
  info['tp_collectives'] lists every measured collective as 'KIND:site' (on a grid
  'KIND:group:site') -> [count, bytes, seconds], and info['tp_inside_s'] the time left
  inside the span.
A TP op that finds fewer measured collectives than its count says so in its info
('measured' < 'count'); so does the I of stage 0, which computes no input gradient
(kernels.split_backward: its W runs the whole backward, and the collectives with it).
With full recompute (kernels.stage) a B op's measured collectives include those of its
layers' rerun forward, the MLP's trailing one too (checkpoint early stop is off: kernels.
layers.checkpointed), as the IR's B ops count them (schedules.comm_spec.Covered).
With sequence parallelism each B and W op ends by summing over TP the gradients it added
to the SP-replicated parameters (kernels.tensor_parallel.SequenceGradients), inside its
compute span. Units: seconds, bytes.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from clustersim.schedules.contract import is_intra_layer
from clustersim.schedules.names import TP, TP_GRID_GROUPS
from clustersim.schedules.ops import WEIGHT_GRAD_KINDS, WORK_KINDS, Op

from .tensor_parallel import CollectiveRecord, SequenceGradients, TensorParallel

TENSOR_GROUPS = frozenset({TP}) | TP_GRID_GROUPS  # the groups of the TP ops the kernels run


def tp_owners(program: list[Op]) -> dict[int, int]:
    """TP op index -> index of the compute op it belongs to: the previous compute op for
    a blocking op, the next one for an `alongside` op (schedules.contract's placement)."""
    owners: dict[int, int] = {}
    previous, waiting = None, []
    for index, op in enumerate(program):
        if op.kind in WORK_KINDS:
            owners.update((w, index) for w in waiting)
            previous, waiting = index, []
        elif is_intra_layer(op) and op.group in TENSOR_GROUPS:
            if op.alongside:
                waiting.append(index)
            elif previous is not None:
                owners[index] = previous
    return owners


class TensorParallelOps:
    """Mixin: TP op handler, per-compute-op collective records, their span layout, and
    the SP gradient sum of weight-gradient ops."""

    def _init_tensor_parallel(self, tp: TensorParallel) -> None:
        self.tp = tp
        self._sequence_grads: SequenceGradients | None = None
        self._sequence_params: dict[tuple, SequenceGradients] = {}
        self.tp_owners = tp_owners(self.program)
        self._owned: dict[int, list[int]] = {}
        for tp_index, owner in sorted(self.tp_owners.items()):
            self._owned.setdefault(owner, []).append(tp_index)

    def _start_tp_iteration(self) -> None:
        self.tp.take_records()
        self._measured: dict[int, tuple[int, list[CollectiveRecord]]] = {}
        self._tp_span_at: dict[int, int] = {}

    def _stash_sequence_grads(self, op: Op) -> None:
        """Before a B or W op with SP: set its SP-replicated parameters' .grad aside."""
        self._sequence_grads = None
        if op.kind not in WEIGHT_GRAD_KINDS or not self.tp.sequence_parallel:
            return
        key = (op.stage, op.chunk)
        if key not in self._sequence_params:
            params = self.modules[op.stage].chunk_parameters(op.chunk, self.schedule.layer_groups)
            self._sequence_params[key] = SequenceGradients(self.tp, [p for _, p in params])
        self._sequence_grads = self._sequence_params[key]
        self._sequence_grads.stash()

    def _reduce_sequence_grads(self) -> None:
        """After the op's work, before its span ends: sum what it added over TP."""
        if self._sequence_grads is not None:
            self._sequence_grads.reduce()
            self._sequence_grads = None

    def _after_compute(self, span_index: int) -> None:
        """Attach the collectives recorded during the current compute op to its span."""
        self._measured[self.index] = (span_index, self.tp.take_records())

    def _tp_op(self, op: Op, state: Any) -> None:
        """A TP collective op: it ran inside its compute op; its span is laid out later."""
        self._tp_span_at[self.index] = len(self.spans)
        self._span(op, op.group, None, None, op.nbytes, {"count": op.count})

    def _layout_tp(self, spans: list[dict]) -> None:
        """Place TP spans after their compute span (module docstring); `spans` are the
        resolved copies of self.spans (seconds)."""
        for owner, (span_index, records) in self._measured.items():
            timed = [(r, self.clock.seconds(r.end) - self.clock.seconds(r.start))
                     for r in records]
            queues: dict[tuple, deque] = {}
            for r, seconds in timed:
                queues.setdefault((r.kind, r.group, r.alongside), deque()).append((r, seconds))
            laid = [self._claim(spans[self._tp_span_at[i]], queues.get(_key(self.program[i]),
                                                                        deque()))
                    for i in self._owned.get(owner, ()) if i in self._tp_span_at]
            compute = spans[span_index]
            if records:
                compute["info"] = {**(compute.get("info") or {}),
                                   "tp_collectives": _summary(timed),
                                   "tp_inside_s": sum(s for q in queues.values() for _, s in q)}
            compute["end"] = t = max(compute["start"], compute["end"] - sum(d for _, d in laid))
            for span, duration in laid:
                span["start"], span["end"] = t, t + duration
                t += duration
        for span in spans:  # a TP op whose compute op never ran (not expected)
            if span["start"] is None:
                span["start"] = span["end"] = 0.0

    @staticmethod
    def _claim(span: dict, queue: deque) -> tuple[dict, float]:
        """The TP op of `span` takes its count of measured collectives from `queue`:
        (span, their summed seconds); its info says how many and how many bytes."""
        taken = [queue.popleft() for _ in range(min(span["info"]["count"], len(queue)))]
        span["info"] = {**span["info"], "measured": len(taken),
                        "measured_bytes": sum(r.nbytes for r, _ in taken)}
        return span, sum(seconds for _, seconds in taken)


def _key(op: Op) -> tuple:
    """The records a TP op claims: (kind, group, alongside)."""
    return op.kind, op.group, op.alongside


def _summary(timed: list[tuple[CollectiveRecord, float]]) -> dict[str, list]:
    """'KIND:site' ('KIND:group:site' off group 'tp') -> [count, bytes, seconds] of the
    measured collectives."""
    out: dict[str, list] = {}
    for r, seconds in timed:
        name = f"{r.kind.value}:{r.site}" if r.group == TP else f"{r.kind.value}:{r.group}:{r.site}"
        entry = out.setdefault(name, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += r.nbytes
        entry[2] += seconds
    return out
