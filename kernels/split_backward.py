"""The zero-bubble backward split (Qi et al. 2024): I = gradient w.r.t. the stage input,
W = gradients w.r.t. the weights, run as two separate ops.

With torch.distributed.pipelining's helpers (`_backward.stage_backward_input/weight`, the
ones its zero-bubble schedules use), I computes the input gradient while saving the
gradients that flow into each weight's GEMM, and W finishes the weight gradients from
them: I + W does the work of one full backward. Without them (older torch), W falls back
to `torch.autograd.grad(out, params, grad)` over the retained graph, which re-traverses
the activation-gradient chain (exact gradients, W's time overstated).

A stage whose input needs no gradient (stage 0: token ids) has an empty I, and its W is
the full backward — as in torch.distributed.pipelining.

Activation recomputation (kernels.stage): torch's checkpoint recomputes a checkpointed
region once per autograd pass that unpacks its saved tensors. Selective recompute
checkpoints the core attention, which has no weights, so I recomputes it and W does not:
the split is exact (the older-torch fallback's W re-traverses the graph and recomputes
it again: exact gradients, W's time overstated further). Full recompute checkpoints whole layers: I recomputes them, and
then every weight group of W unpacks the layer's saved inputs in its own pass and
recomputes the layer again (measured: 8 more forwards per layer of the GPT test model),
TP collectives included, where the IR (schedules.comm_spec.Covered.forward_layers)
charges one recompute to I and none to W. `check_recompute_split` refuses that pairing.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.schedule import Schedule

from .errors import KernelsError

try:  # private but stable since torch 2.5; the fallback keeps older torch working
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
except ImportError:  # pragma: no cover
    stage_backward_input = stage_backward_weight = None

EXACT_SPLIT = stage_backward_input is not None


def backward_input(out: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor,
                   params: Sequence[torch.nn.Parameter]) -> tuple[torch.Tensor | None, Any]:
    """(gradient w.r.t. x or None, state for `backward_weight`); `grad` is the gradient
    w.r.t. `out` (None when `out` is the loss)."""
    if not x.requires_grad:
        return None, ("full", out, grad)
    if EXACT_SPLIT:
        dinputs, param_groups = stage_backward_input(
            [out], None if grad is None else [grad], [x], iter(params))
        return dinputs[0], ("groups", param_groups)
    (dx,) = torch.autograd.grad(out, x, grad, retain_graph=True)
    return dx, ("regrad", out, grad)


def backward_weight(params: Sequence[torch.nn.Parameter], state: Any) -> None:
    """Accumulate the weight gradients into `.grad`, from `backward_input`'s state."""
    kind = state[0]
    if kind == "full":
        torch.autograd.backward(state[1], state[2])
    elif kind == "groups":
        stage_backward_weight(iter(params), state[1])
    else:
        grads = torch.autograd.grad(state[1], list(params), state[2], allow_unused=True)
        for p, g in zip(params, grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)


def check_recompute_split(schedule: Schedule, parallel: ParallelConfig) -> None:
    """KernelsError when recompute='full' meets a schedule with I/W ops (module docstring)."""
    if parallel.recompute != "full":
        return
    split = next((op for op in schedule.ops() if op.kind in (OpKind.I, OpKind.W)), None)
    if split is not None:
        raise KernelsError(
            f"recompute='full' with schedule {schedule.name!r}, which splits the backward "
            f"into I and W ops ({split}): the kernels checkpoint every layer with torch's "
            f"checkpoint, which reruns the layer's forward in each backward pass over it, "
            f"so W would recompute the layers again (and their TP collectives), where the "
            f"simulator charges the recompute to I only; use recompute='selective' or "
            f"'none' with a zero-bubble schedule, or a schedule with B ops (1f1b, "
            f"interleaved-1f1b, gpipe) with recompute='full'", op=str(split))
