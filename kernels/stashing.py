"""Weight stashing for real (PipeDream, PipeDream-2BW; the rules and their sources:
schedules.weight_stashing): each forward runs on the weight version the schedule's rule
gives its microbatch, and its backward on the same version, while the stage's live
weights take an optimizer step after every update.

A version is a copy of the stage's parameters (`torch.func.functional_call` runs the
module on it; its tensors are leaves, so the backward's gradients land on them and are
then added to the live parameters' `.grad`, where the data-parallel ops and OPT_STEP read
them). A copy is taken when its first forward runs, or just before the step that would
overwrite it when a later forward still needs it; it is dropped after the last backward
that uses it. The live weights are a copy of their own, so these ranks hold one copy more
than the versions the memory model counts (the paper's count includes the live weights).

A forward whose version is newer than the stage's updates so far, or older and no longer
kept, raises KernelsError: the rule and the program disagree. The versions restart at 0
with each run of the program (it starts and ends with a flushed pipeline), the live
weights carry on.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.func import functional_call

from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.weight_stashing import AsyncRun

from .errors import KernelsError
from .stage import StageModule


class StashedWeights:
    """The weight versions of one pipeline rank's stages (module docstring)."""

    def __init__(self, run: AsyncRun, modules: dict[int, StageModule], program: list[Op],
                 pp: int, pipeline_rank: int):
        self.run, self.modules, self.program = run, modules, program
        self.pp, self.rank = pp, pipeline_rank
        self.start()

    def start(self) -> None:
        """Before each run of the program: no update yet, no copy."""
        self.updates = dict.fromkeys(self.modules, 0)
        self.copies: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.users = Counter((op.stage, self.version(op.microbatch)) for op in self.program
                             if op.kind is OpKind.F and op.chunk is None)
        self.stepped = set()  # stages whose .grad holds the last update's gradients

    def version(self, microbatch: int) -> int:
        return self.run.stashing.version_used(self.pp, self.rank, microbatch,
                                              self.run.iteration_microbatches)

    def _copy(self, stage: int) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone().requires_grad_(p.requires_grad)
                for name, p in self.modules[stage].named_parameters()}

    def weights_for(self, op: Op) -> dict[str, torch.Tensor]:
        """The version of (op.stage, op.microbatch), copied now if it is the live one."""
        s, v = op.stage, self.version(op.microbatch)
        if (s, v) not in self.copies:
            if v != self.updates[s]:
                raise KernelsError(f"op {op}: weight version {v} of stage {s} is not kept "
                                   f"(the stage has taken {self.updates[s]} updates): the "
                                   f"stashing rule {self.run.stashing.rule!r} and the program "
                                   f"disagree")
            self.copies[(s, v)] = self._copy(s)
        return self.copies[(s, v)]

    def forward(self, module: StageModule, op: Op, args: tuple) -> torch.Tensor:
        return functional_call(module, self.weights_for(op), args)

    def collect_grads(self, op: Op) -> None:
        """After a backward (or a layer group of it): move the version's gradients onto the
        live parameters' `.grad` (reset first after a step: the next update starts)."""
        s = op.stage
        live = dict(self.modules[s].named_parameters())
        if s in self.stepped:
            self.stepped.discard(s)
            for p in live.values():
                p.grad = None
        for name, tensor in self.copies[(s, self.version(op.microbatch))].items():
            if tensor.grad is not None:
                p = live[name]
                p.grad = tensor.grad if p.grad is None else p.grad + tensor.grad
                tensor.grad = None

    def backward_done(self, op: Op) -> None:
        """After the last part of B(s, m): drop its version when no one needs it."""
        key = (op.stage, self.version(op.microbatch))
        self.users[key] -= 1
        if self.users[key] == 0:
            self.copies.pop(key, None)

    def before_step(self, stage: int) -> None:
        """Keep the version a step is about to overwrite while a forward still needs it."""
        key = (stage, self.updates[stage])
        if self.users[key] > 0 and key not in self.copies:
            self.copies[key] = self._copy(stage)

    def after_step(self, stage: int) -> None:
        self.updates[stage] += 1
        self.stepped.add(stage)


def check_stashing(plan: Any) -> None:
    """Refuse what weight stashing here does not run: recomputation (its rerun of the
    forward in the backward would see the live weights, not the stashed version) and a tied
    embedding on two pipeline ranks (each copy would stash its own versions)."""
    parallel, model = plan.parallel, plan.model
    if parallel.recompute != "none":
        raise KernelsError(f"recompute={parallel.recompute!r} with weight stashing "
                           f"({parallel.schedule}): the backward's rerun of the forward would "
                           f"use the live weights, not the stashed version; use recompute "
                           f"'none' in the kernels backend")
    if parallel.pp > 1 and not model.untie_embeddings_and_output_weights:
        raise KernelsError(f"tied embeddings with weight stashing ({parallel.schedule}) on "
                           f"{parallel.pp} pipeline ranks: the first and last stage would "
                           f"stash different versions of one weight; untie them "
                           f"(untie_embeddings_and_output_weights=True)")
