"""The per-rank op loop: one rank's program of a lowered schedule, executed for real.

Ops run in program order on one compute stream; each op's waits are exactly those of
schedules.contract: `prerequisites` (a compute product of this rank, `program_products`,
or a posted RECV) and the positional waits of data-parallel ops (`program_contract`'s
`local`), which block until the awaited comm op has completed and its result is applied:
- F(s,m): forward of stage s on microbatch m; input = the token ids of m (stage 0), the
  received activation, or the local output of stage s-1, as a leaf that requires grad.
  The last stage returns loss / num_microbatches, so accumulated gradients are those of
  the mean loss over the replica's batch.
- Layer groups (`Op.chunk`, G = schedule.layer_groups): a stage always runs as its G
  groups, each group's input a detached leaf (the activation between groups stays local),
  so a chunked op runs one group and an unchunked op all of them (backward in reverse):
  a backward split into groups can follow a forward that was not, as the DDP pass emits.
- B(s,m): full backward through autograd (weight grads accumulate into `.grad`).
- An asynchronous schedule (PipeDream, 2BW): F and B run on the stashed weight version
  of their microbatch (kernels.stashing); the loss is divided by the microbatches of one
  update, and every batch of the run reads the same global batch's rows.
- I(s,m) / W(s,m): the zero-bubble split of B (kernels.split_backward), per group: I
  computes the input gradient and keeps what W needs; W accumulates the weight gradients.
  Stage 0 group 0 has no input gradient: its I is empty and its W is its whole backward.
- SEND_*/RECV_*: kernels.p2p_ops, posted when reached; a RECV is waited on only by the
  ops that consume it.
- loopback (replay of one pipeline rank alone on one device): a RECV yields a fresh
  random tensor of the activation shape at once, a SEND is dropped, a collective is one
  of a group of one; no span for any of them.
- ALL_REDUCE / REDUCE_SCATTER / ALL_GATHER on a DP group and OPT_STEP: kernels.dp_ops.
  A comm op whose positional waits name an unfinished comm op (HSDP's replica all-reduce
  after its reduce-scatter) blocks the program until that one completes.
- Tensor parallelism: the TP ranks of one (pp, dp) coordinate run the same program on
  their shards; the TP collectives run inside the compute ops (kernels.tensor_parallel),
  and the program's TP ops (group 'tp', schedules.intra_layer) become spans on the 'tp'
  lane from the times measured there (kernels.tp_ops). With sequence parallelism the
  activation between stages is the sequence shard (b, s/t, h); on a 2D grid
  (kernels.summa, ops on 'tp_row' and 'tp_col', on lanes of those names) the block
  (b/q, s, h/q).
- Activation recomputation lives in the modules (kernels.stage): under 'full' a B (or
  a chunked B of layer groups) first reruns its layers' forward, TP collectives included,
  which kernels.tp_ops attributes to that B as the IR does; 'full' with I/W ops is
  refused before the run (kernels.split_backward.check_recompute_split).

Spans (`kernels.timing` markers) go on lanes `compute`, `send`, `recv` and the collective's
group; comm spans run from post to completion. Units: seconds (perf_counter), bytes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from clustersim.schedules.contract import (is_gradient_collective, is_intra_layer,
                                           is_parameter_gather, program_contract,
                                           program_needs, program_products)
from clustersim.schedules.names import COMPUTE_LANE
from clustersim.schedules.ops import WORK_KINDS, Op, OpKind
from clustersim.schedules.schedule import Schedule

from .dp_ops import DataParallelOps
from .errors import KernelsError
from .layers import torch_dtype
from .p2p_ops import P2POps, key_text
from .posted import Pending, PostedOps
from .split_backward import backward_input, backward_weight
from .stashing import StashedWeights
from .stage import StageModule, microbatch_rows
from .tensor_parallel import TensorParallel
from .tp_ops import TENSOR_GROUPS, TensorParallelOps

Key = tuple


@dataclass
class RankSetup:
    """What one rank needs: its place in the grid and its process groups.

    `pp_ranks[p]` is the global rank of pipeline rank p in this rank's PP group;
    `groups` maps 'p2p_f', 'p2p_b', 'dp' (and 'dp_shard', 'dp_replicate' for hybrid
    sharding) to process groups (None = the world); `group_ranks` the DP axes to their
    global ranks in group order; `loopback` replays the rank without peers;
    `single_process`: the DP ranks are torch.nn.DataParallel's replicas."""

    rank: int
    pipeline_rank: int
    dp_rank: int
    pp_ranks: list[int]
    groups: dict[str, Any]
    dp_size: int
    timeout: float
    loopback: bool = False
    group_ranks: dict[str, list[int]] = field(default_factory=dict)
    single_process: bool = False  # torch.nn.DataParallel (schedules.single_process_dp)


@dataclass
class IterationState:
    chunks: dict[tuple, tuple] = field(default_factory=dict)  # (s,m,g) -> (input, output)
    out_grads: dict[tuple, torch.Tensor] = field(default_factory=dict)  # (s,m,g) -> d output
    input_grads: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    split: dict[tuple, tuple] = field(default_factory=dict)  # I -> W, per (s,m,g)
    done: set = field(default_factory=set)
    posted: set = field(default_factory=set)  # keys of the P2P ops posted so far
    recvs: dict[Key, tuple] = field(default_factory=dict)  # key -> (completion, buffer)


class RankExecutor(PostedOps, P2POps, DataParallelOps, TensorParallelOps):
    """Runs `schedule.programs[pipeline_rank]` on `modules` (stage -> StageModule, built
    with `tp`)."""

    def __init__(self, schedule: Schedule, modules: dict[int, StageModule], setup: RankSetup,
                 tokens: torch.Tensor, labels: torch.Tensor, clock: Any,
                 on_op: Callable[[int], None] = lambda index: None,
                 tp: TensorParallel | None = None):
        self.schedule, self.modules, self.setup = schedule, modules, setup
        self.program = schedule.programs[setup.pipeline_rank]
        self.tokens, self.labels, self.clock, self.on_op = tokens, labels, clock, on_op
        spec = next(iter(modules.values())).spec
        tp = tp if tp is not None else TensorParallel(clock=clock)
        self.micro_batch_size = spec.micro_batch_size
        self.activation_shape = tp.activation_shape(spec.micro_batch_size, spec.seq_length,
                                                    spec.hidden_size)
        self.dtype = torch_dtype(spec)
        self.device = tokens.device
        self.groups = schedule.layer_groups
        self.chains = schedule.stage_chains
        self.contract = program_contract(self.program, schedule.stage_ranks,  # positional
                                         self.chains)
        self.needs = program_needs(self.program, self.contract, schedule.stage_ranks,
                                   schedule.num_microbatches, self.chains)
        self.products = program_products(self.program)
        run = schedule.asynchronous
        self.stash = (StashedWeights(run, modules, self.program, schedule.num_ranks,
                                     setup.pipeline_rank) if run else None)
        self.micro = schedule.iteration_microbatches  # M: the rows of one batch
        self.loss_divisor = (run.update_every if run else  # microbatches of one gradient:
                             schedule.num_microbatches // schedule.chains)  # of its chain
        if setup.single_process:  # DataParallel's mean loss over replicas; REDUCE sums
            self.loss_divisor *= setup.dp_size
        self.current: Op | None = None
        self.index = -1
        self.spans: list[dict] = []
        self.memory: list[tuple[Any, int]] = []
        self._pending: dict[int, Pending] = {}
        self._init_data_parallel(self.contract)
        self._init_tensor_parallel(tp)

    # --- the loop --------------------------------------------------------------------
    def run_iteration(self) -> None:
        """Execute the program once; spans and memory samples (markers) accumulate."""
        self.spans, self.memory, self._pending = [], [], {}
        self._start_dp_iteration()
        self._start_tp_iteration()
        if self.stash:
            self.stash.start()
        state = IterationState()
        handlers = {
            OpKind.F: self._forward, OpKind.B: self._backward, OpKind.I: self._input_grad,
            OpKind.W: self._weight_grad, OpKind.SEND_F: self._send, OpKind.SEND_B: self._send,
            OpKind.RECV_F: self._recv, OpKind.RECV_B: self._recv, OpKind.OPT_STEP: self._opt_step,
        }
        for index, op in enumerate(self.program):
            self.current, self.index = op, index
            self.on_op(index)
            handler = handlers.get(op.kind)
            if is_gradient_collective(op) or is_parameter_gather(op):
                handler = self._dp_collective
            elif is_intra_layer(op) and op.group in TENSOR_GROUPS:
                handler = self._tp_op
            if handler is None:
                raise KernelsError(f"op {op}: kind {op.kind.value} (group {op.group}) is not "
                                   f"supported by the kernels backend")
            self._check_ready(index, op, state)
            self._stash_sequence_grads(op)
            handler(op, state)
            if op.kind.is_compute:
                state.done.update(self.products[index])
                self._reshard_after(index)
        self.current = None
        self.on_op(len(self.program))
        self._drain()

    def _check_ready(self, index: int, op: Op, state: IterationState) -> None:
        for key in self.needs[index]:
            if key[0].is_p2p:
                if key not in state.posted:
                    raise KernelsError(f"op {op} needs {key_text(key)}, which this rank has not "
                                       f"posted before it: the schedule deadlocks")
            elif key not in state.done:
                raise KernelsError(f"op {op} needs {key_text(key)}, which has not run on this "
                                   f"rank before it: the schedule deadlocks")
        for j in self.contract.local[index]:
            self._complete(j)
        if op.kind in WORK_KINDS:
            self._check_gathered(op)

    # --- compute ---------------------------------------------------------------------
    def _compute_span(self, op: Op, start: Any) -> None:
        self._reduce_sequence_grads()
        end = self.clock.mark()
        self._span(op, COMPUTE_LANE, start, end, op.nbytes, None)
        self._after_compute(len(self.spans) - 1)
        if self.device.type == "cuda":
            self.memory.append((end, torch.cuda.memory_allocated(self.device)))

    def _groups_of(self, op: Op, reverse: bool) -> list[int]:
        if op.chunk is not None:
            return [op.chunk]
        return list(range(self.groups - 1, -1, -1) if reverse else range(self.groups))

    def _rows(self, m: int) -> slice:
        """This replica's rows of microbatch m (of the batch m falls in: every batch of an
        asynchronous run reads the same global batch)."""
        return microbatch_rows(self.setup.dp_rank, m % self.micro if self.stash else m,
                               self.micro_batch_size, self.micro)

    def _stage_input(self, s: int, m: int, state: IterationState) -> torch.Tensor:
        before = self.chains.previous(s)
        if before is None:
            return self.tokens[self._rows(m)]
        if self._is_local(before):
            return state.chunks[(before, m, self.groups - 1)][1].detach().requires_grad_()
        return self._take_recv((OpKind.RECV_F, s, m), state).requires_grad_()

    def _chunk_input(self, s: int, m: int, g: int, state: IterationState) -> torch.Tensor:
        if g == 0:
            return self._stage_input(s, m, state)
        return state.chunks[(s, m, g - 1)][1].detach().requires_grad_()

    def _forward(self, op: Op, state: IterationState) -> None:
        s, m = op.stage, op.microbatch
        module = self.modules[s]
        rows = self._rows(m)
        order = self._groups_of(op, False)
        x = self._chunk_input(s, m, order[0], state)  # may wait for a RECV: before the span
        start = self.clock.mark()
        for g in order:
            if g != order[0]:
                x = self._chunk_input(s, m, g, state)
            head = module.last and g == self.groups - 1
            args = (x, self.labels[rows] if head else None, g, self.groups)
            out = self.stash.forward(module, op, args) if self.stash else module(*args)
            if head:
                out = out / self.loss_divisor
            state.chunks[(s, m, g)] = (x, out)
        self._compute_span(op, start)

    def _output_grad(self, s: int, m: int, g: int, state: IterationState
                     ) -> torch.Tensor | None:
        """Gradient w.r.t. the output of group g of stage s (None: it is the loss)."""
        if g < self.groups - 1:
            return state.out_grads.pop((s, m, g))
        after = self.chains.next(s)
        if after is None:
            return None
        if self._is_local(after):
            return state.input_grads.pop((after, m))
        return self._take_recv((OpKind.RECV_B, s, m), state)

    def _pass_input_grad(self, s: int, m: int, g: int, dx: torch.Tensor | None,
                         state: IterationState) -> None:
        if g > 0:
            state.out_grads[(s, m, g - 1)] = dx
        elif not self.chains.is_first(s):
            state.input_grads[(s, m)] = dx

    def _backward_groups(self, op: Op, state: IterationState, step: Callable) -> None:
        """Run `step(g, x, out, grad) -> input grad` for the op's groups, in reverse."""
        s, m = op.stage, op.microbatch
        order = self._groups_of(op, True)
        grad = self._output_grad(s, m, order[0], state)  # may wait for a RECV
        start = self.clock.mark()
        for g in order:
            if g != order[0]:
                grad = self._output_grad(s, m, g, state)
            x, out = state.chunks.pop((s, m, g))
            self._pass_input_grad(s, m, g, step(g, x, out, grad), state)
        self._compute_span(op, start)

    def _backward(self, op: Op, state: IterationState) -> None:
        def step(g: int, x: torch.Tensor, out: torch.Tensor, grad: Any) -> Any:
            torch.autograd.backward(out, grad)
            if self.stash:
                self.stash.collect_grads(op)
            return x.grad if x.requires_grad else None
        self._backward_groups(op, state, step)
        if self.stash and op.chunk in (None, 0):  # the last group of B runs group 0
            self.stash.backward_done(op)

    def _input_grad(self, op: Op, state: IterationState) -> None:
        module = self.modules[op.stage]

        def step(g: int, x: torch.Tensor, out: torch.Tensor, grad: Any) -> Any:
            params = [p for _, p in module.chunk_parameters(g, self.groups) if p.requires_grad]
            dx, saved = backward_input(out, grad, x, params)
            state.split[(op.stage, op.microbatch, g)] = (params, saved)
            return dx
        self._backward_groups(op, state, step)

    def _weight_grad(self, op: Op, state: IterationState) -> None:
        start = self.clock.mark()
        for g in self._groups_of(op, True):
            params, saved = state.split.pop((op.stage, op.microbatch, g))
            backward_weight(params, saved)
        self._compute_span(op, start)

    def resolve(self) -> tuple[list[dict], list[tuple[float, int]]]:
        """Spans and memory samples of the last iteration, markers turned into seconds."""
        spans = [{**s, **{k: None if s[k] is None else self.clock.seconds(s[k])
                          for k in ("start", "end")}} for s in self.spans]
        self._layout_tp(spans)
        memory = [(self.clock.seconds(t), n) for t, n in self.memory]
        return spans, memory
