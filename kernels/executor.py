"""The per-rank op loop: one rank's program of a lowered schedule, executed for real.

Ops run in program order on one compute stream; each op's waits are exactly
`schedules.contract.prerequisites` (a compute product of this rank, or a posted RECV):
- F(s,m): forward of stage s on microbatch m; input = the token ids of m (stage 0), the
  received activation, or the local output of stage s-1, as a leaf that requires grad.
  The last stage returns loss / num_microbatches, so accumulated gradients are those of
  the mean loss over the replica's batch.
- B(s,m): full backward through autograd (weight grads accumulate into `.grad`).
- I(s,m) / W(s,m): the zero-bubble split of B (kernels.split_backward): I computes the
  input gradient and keeps what W needs; W accumulates the weight gradients into `.grad`.
  Stage 0 has no input gradient: its I is empty and its W is the whole backward.
- SEND_*/RECV_*: `dist.isend`/`dist.irecv` posted when reached (forward and backward
  traffic on separate process groups, so one direction never queues behind the other);
  a RECV is waited on only by the op that consumes it.
- loopback (replay of one pipeline rank alone on one device): a RECV yields a fresh
  random tensor of the activation shape at once, a SEND is dropped; no span for either.
- ALL_REDUCE(s, group='dp'): stage s's gradients, flattened into one buffer, all-reduced
  (sum) over the DP group, divided by its size (the mean over replicas) when it completes.

Spans (`kernels.timing` markers) go on lanes `compute`, `send`, `recv` and the collective's
group; comm spans run from post to completion. Units: seconds (perf_counter), bytes.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from schedules.contract import p2p_peer, prerequisites, produces
from schedules.ops import Op, OpKind
from schedules.p2p import boundary
from schedules.schedule import Schedule

from .errors import KernelsError
from .layers import torch_dtype
from .split_backward import backward_input, backward_weight
from .stage import StageModule, microbatch_rows
from .timing import Completion, track_completion

Key = tuple[OpKind, int, int | None]


@dataclass
class RankSetup:
    """What one rank needs: its place in the grid and its process groups.

    `pp_ranks[p]` is the global rank of pipeline rank p in this rank's PP group;
    `groups` maps 'p2p_f', 'p2p_b' and 'dp' to process groups (None = the world);
    `loopback` replays the rank without peers (see the module docstring)."""

    rank: int
    pipeline_rank: int
    dp_rank: int
    pp_ranks: list[int]
    groups: dict[str, Any]
    dp_size: int
    timeout: float
    loopback: bool = False


@dataclass
class IterationState:
    inputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    outputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    input_grads: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    split: dict[tuple[int, int], tuple] = field(default_factory=dict)  # I -> W
    done: set = field(default_factory=set)
    recvs: dict[Key, tuple] = field(default_factory=dict)  # key -> (completion, buffer)


class RankExecutor:
    """Runs `schedule.programs[pipeline_rank]` on `modules` (stage -> StageModule)."""

    def __init__(self, schedule: Schedule, modules: dict[int, StageModule], setup: RankSetup,
                 tokens: torch.Tensor, labels: torch.Tensor, clock: Any,
                 on_op: Callable[[int], None] = lambda index: None):
        self.schedule, self.modules, self.setup = schedule, modules, setup
        self.program = schedule.programs[setup.pipeline_rank]
        self.tokens, self.labels, self.clock, self.on_op = tokens, labels, clock, on_op
        spec = next(iter(modules.values())).spec
        self.activation_shape = (spec.micro_batch_size, spec.seq_length, spec.hidden_size)
        self.dtype = torch_dtype(spec)
        self.device = tokens.device
        self.current: Op | None = None
        self.spans: list[dict] = []
        self.memory: list[tuple[Any, int]] = []
        self._inflight: list[tuple] = []  # (completion, tensor kept alive, span, finish)

    # --- the loop --------------------------------------------------------------------
    def run_iteration(self) -> None:
        """Execute the program once; spans and memory samples (markers) accumulate."""
        self.spans, self.memory, self._inflight = [], [], []
        state = IterationState()
        handlers = {
            OpKind.F: self._forward, OpKind.B: self._backward, OpKind.I: self._input_grad,
            OpKind.W: self._weight_grad, OpKind.SEND_F: self._send, OpKind.SEND_B: self._send,
            OpKind.RECV_F: self._recv, OpKind.RECV_B: self._recv,
            OpKind.ALL_REDUCE: self._all_reduce,
        }
        for index, op in enumerate(self.program):
            self.current = op
            self.on_op(index)
            handler = handlers.get(op.kind)
            if handler is None:
                raise KernelsError(f"op {op}: kind {op.kind.value} is not supported by the "
                                   f"kernels backend")
            self._check_ready(op, state)
            handler(op, state)
            if op.kind.is_compute:
                state.done.update(produces(op))
        self.current = None
        self.on_op(len(self.program))
        self._drain(state)

    def _check_ready(self, op: Op, state: IterationState) -> None:
        needs = prerequisites(op, self.schedule.stage_ranks, self.schedule.num_microbatches)
        for key in needs:
            if key[0].is_p2p:
                if key not in state.recvs:
                    raise KernelsError(f"op {op} needs {_text(key)}, which this rank has not "
                                       f"posted before it: the schedule deadlocks")
            elif key not in state.done:
                raise KernelsError(f"op {op} needs {_text(key)}, which has not run on this "
                                   f"rank before it: the schedule deadlocks")

    # --- compute ---------------------------------------------------------------------
    def _compute_span(self, op: Op, start: Any) -> None:
        end = self.clock.mark()
        self._span(op, "compute", start, end, op.nbytes, None)
        if self.device.type == "cuda":
            self.memory.append((end, torch.cuda.memory_allocated(self.device)))

    def _forward(self, op: Op, state: IterationState) -> None:
        s, m = op.stage, op.microbatch
        module = self.modules[s]
        rows = microbatch_rows(self.setup.dp_rank, m, self.activation_shape[0],
                               self.schedule.num_microbatches)
        if s == 0:
            x = self.tokens[rows]
        elif self._is_local(s - 1):
            x = state.outputs[(s - 1, m)].detach().requires_grad_()
        else:
            x = self._take_recv((OpKind.RECV_F, s, m), state).requires_grad_()
        labels = self.labels[rows] if module.last else None
        start = self.clock.mark()
        out = module(x, labels)
        if module.last:
            out = out / self.schedule.num_microbatches
        self._compute_span(op, start)
        state.inputs[(s, m)], state.outputs[(s, m)] = x, out

    def _output_grad(self, s: int, m: int, state: IterationState) -> torch.Tensor | None:
        """Gradient w.r.t. the output of stage s (None: the output is the loss)."""
        if s == self.schedule.num_stages - 1:
            return None
        if self._is_local(s + 1):
            return state.input_grads.pop((s + 1, m))
        return self._take_recv((OpKind.RECV_B, s, m), state)

    def _backward(self, op: Op, state: IterationState) -> None:
        s, m = op.stage, op.microbatch
        grad = self._output_grad(s, m, state)
        x, out = state.inputs.pop((s, m)), state.outputs.pop((s, m))
        start = self.clock.mark()
        torch.autograd.backward(out, grad)
        self._compute_span(op, start)
        if s > 0:
            state.input_grads[(s, m)] = x.grad

    def _input_grad(self, op: Op, state: IterationState) -> None:
        s, m = op.stage, op.microbatch
        grad = self._output_grad(s, m, state)
        x, out = state.inputs.pop((s, m)), state.outputs.pop((s, m))
        params = [p for p in self.modules[s].parameters() if p.requires_grad]
        start = self.clock.mark()
        dx, saved = backward_input(out, grad, x, params)
        self._compute_span(op, start)
        if s > 0:
            state.input_grads[(s, m)] = dx
        state.split[(s, m)] = (params, saved)

    def _weight_grad(self, op: Op, state: IterationState) -> None:
        params, saved = state.split.pop((op.stage, op.microbatch))
        start = self.clock.mark()
        backward_weight(params, saved)
        self._compute_span(op, start)

    # --- point to point --------------------------------------------------------------
    def _is_local(self, stage: int) -> bool:
        return self.schedule.rank_of_stage(stage) == self.setup.pipeline_rank

    def _p2p_args(self, op: Op) -> tuple[int, Any, int]:
        """(peer global rank, process group, tag) of a P2P op; both ends compute the same
        group and tag from (direction, boundary, microbatch)."""
        _, peer_stage, m = p2p_peer(op)
        peer = self.setup.pp_ranks[self.schedule.rank_of_stage(peer_stage)]
        forward = op.kind in (OpKind.SEND_F, OpKind.RECV_F)
        tag = boundary(op.kind, op.stage) * self.schedule.num_microbatches + m
        return peer, self.setup.groups["p2p_f" if forward else "p2p_b"], tag

    def _send(self, op: Op, state: IterationState) -> None:
        s, m = op.stage, op.microbatch
        if op.kind is OpKind.SEND_F:
            tensor = state.outputs[(s, m)].detach().contiguous()
        else:
            tensor = state.input_grads.pop((s, m)).contiguous()
        if self.setup.loopback:
            return
        peer, group, tag = self._p2p_args(op)
        start = self.clock.mark()
        work = dist.isend(tensor, peer, group=group, tag=tag)
        self._post(op, "send", work, tensor, start, {"peer": peer})

    def _recv(self, op: Op, state: IterationState) -> None:
        if self.setup.loopback:
            buffer = torch.randn(self.activation_shape, dtype=self.dtype, device=self.device)
            state.recvs[op.key] = (None, buffer)
            return
        buffer = torch.empty(self.activation_shape, dtype=self.dtype, device=self.device)
        peer, group, tag = self._p2p_args(op)
        start = self.clock.mark()
        work = dist.irecv(buffer, peer, group=group, tag=tag)
        state.recvs[op.key] = (self._post(op, "recv", work, buffer, start, {"peer": peer}),
                               buffer)

    def _take_recv(self, key: Key, state: IterationState) -> torch.Tensor:
        done, buffer = state.recvs.pop(key)
        if done is not None:  # None: a loopback RECV, ready at once
            self._wait(done, f"waiting for {_text(key)}")
        return buffer

    # --- collectives -----------------------------------------------------------------
    def _all_reduce(self, op: Op, state: IterationState) -> None:
        if op.group != "dp":
            raise KernelsError(f"op {op}: ALL_REDUCE over group {op.group!r} is not supported "
                               f"(only 'dp': a stage's gradients)")
        params = [p for p in self.modules[op.stage].parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        start = self.clock.mark()
        work = dist.all_reduce(flat, group=self.setup.groups["dp"], async_op=True)
        size = self.setup.dp_size

        def finish() -> None:
            flat.div_(size)
            offset = 0
            for p in params:
                n = p.numel()
                p.grad = flat[offset:offset + n].view_as(p).clone()
                offset += n

        self._post(op, op.group, work, flat, start, {"group_size": size}, finish)

    # --- bookkeeping -----------------------------------------------------------------
    def _post(self, op: Op, lane: str, work: Any, tensor: torch.Tensor, start: Any,
              info: dict, finish: Callable[[], None] | None = None) -> Completion:
        nbytes = tensor.numel() * tensor.element_size()
        span = self._span(op, lane, start, None, nbytes, info)
        done = track_completion(work)
        self._inflight.append((done, tensor, span, finish))
        return done

    def _span(self, op: Op, lane: str, start: Any, end: Any, nbytes: int,
              info: dict | None) -> dict:
        span = {"rank": self.setup.rank, "lane": lane, "op": str(op), "start": start,
                "end": end, "nbytes": int(nbytes), "flops": float(op.flops)}
        if op.group is not None:
            span["group"] = op.group
        if info:
            span["info"] = info
        self.spans.append(span)
        return span

    def _wait(self, done: Completion, what: str) -> None:
        try:
            done.wait(self.setup.timeout)
        except Exception as exc:  # noqa: BLE001 (re-raised with the op named)
            raise KernelsError(f"{what}: {type(exc).__name__}: {exc}") from exc

    def _drain(self, state: IterationState) -> None:
        """Wait for every posted comm op, apply collective results, then resolve markers."""
        for done, _, span, finish in self._inflight:
            self._wait(done, f"completing {span['op']}")
            if finish is not None:
                finish()
        self.clock.synchronize()
        for done, _, span, _ in self._inflight:
            span["end"] = done.time if done.time is not None else time.perf_counter()
        self._inflight = []

    def resolve(self) -> tuple[list[dict], list[tuple[float, int]]]:
        """Spans and memory samples of the last iteration, markers turned into seconds."""
        spans = [{**s, "start": self.clock.seconds(s["start"]), "end": self.clock.seconds(s["end"])}
                 for s in self.spans]
        memory = [(self.clock.seconds(t), n) for t, n in self.memory]
        return spans, memory


def _text(key: Key) -> str:
    kind, stage, microbatch = key
    return f"{stage}{kind.value}{'' if microbatch is None else microbatch}"
