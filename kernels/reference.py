"""The single-process reference every distributed run must reproduce: the whole model
in one process on the global batch (mean loss), its gradients and, for schedules with
OPT_STEP, torch.optim.Adam steps (kernels.optimizer.reference_optimizer). For an
asynchronous schedule (PipeDream, 2BW), `run_stale_reference` applies the same stale
weights: microbatch by microbatch, each stage on the version the stashing rule gives
(schedules.weight_stashing), stepping each stage after every update.
Units: gradients and parameters in the model dtype, by global parameter name.
"""
from __future__ import annotations

import torch

from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.plan import Plan
from clustersim.schedules.weight_stashing import AsyncRun

from .optimizer import reference_optimizer
from .stage import build_stages, microbatch_rows, named_parameters, token_batch


def run_reference(model: ModelSpec, parallel: ParallelConfig, seed: int = 0,
                  device: str = "cpu") -> dict[str, torch.Tensor]:
    """Gradients of the mean loss over the global batch (micro_batch_size *
    num_microbatches * dp sequences) for the whole model in this process, by name."""
    module = build_stages(model, [0], 1, seed, device)[0]
    tokens, labels = token_batch(model, parallel.global_batch_size, seed, device)
    module(tokens, labels).backward()
    return {name: p.grad.detach().cpu() for name, p in named_parameters({0: module}).items()}


def run_reference_steps(model: ModelSpec, parallel: ParallelConfig, steps: int = 1,
                        seed: int = 0, device: str = "cpu"
                        ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """`steps` training iterations of the whole model in one process, each the gradient
    of the mean loss over the same global batch then one torch.optim.Adam step
    (kernels.optimizer.reference_optimizer): (last iteration's gradients, parameters
    after the last step), by name."""
    module = build_stages(model, [0], 1, seed, device)[0]
    tokens, labels = token_batch(model, parallel.global_batch_size, seed, device)
    params = named_parameters({0: module})
    optimizer = reference_optimizer(params.values())
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        module(tokens, labels).backward()
        optimizer.step()
    return ({name: p.grad.detach().cpu() for name, p in params.items()},
            {name: p.detach().cpu().clone() for name, p in params.items()})


def run_stale_reference(plan: Plan, run: AsyncRun, runs: int = 1, seed: int = 0,
                        device: str = "cpu"
                        ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """`runs` runs of an asynchronous schedule's K*M microbatches in one process: for each
    microbatch i in order, the loss over every replica's rows of it (mean; divided by the
    microbatches of one update) through each stage s on its weight version
    v = run.stashing.version_used(pp, s, i, M) (one stage per pipeline rank), gradients
    accumulated per stage, and after each update's last microbatch one
    torch.optim.Adam step per stage on its live weights, which become the next version.
    Returns (the last update's gradients, the parameters after the last step), by name."""
    model, parallel = plan.model, plan.parallel
    pp, m, every = parallel.pp, run.iteration_microbatches, run.update_every
    stages = build_stages(model, list(range(pp)), pp, seed, device, split=plan.stage_layers)
    tokens, labels = token_batch(model, parallel.global_batch_size, seed, device)
    optimizers = [reference_optimizer(stages[s].parameters()) for s in range(pp)]
    grads: dict[str, torch.Tensor] = {}
    for _ in range(runs):
        versions = [[_copy(stages[s])] for s in range(pp)]
        for i in range(run.batches * m):
            rows = torch.cat([torch.arange(parallel.global_batch_size)[
                microbatch_rows(d, i % m, model.micro_batch_size, m)]
                for d in range(parallel.dp)])
            used = [versions[s][run.stashing.version_used(pp, s, i, m)] for s in range(pp)]
            x = tokens[rows]
            for s in range(pp):
                x = torch.func.functional_call(
                    stages[s], used[s], (x, labels[rows] if s == pp - 1 else None))
            (x / every).backward()
            for s in range(pp):
                for name, p in stages[s].named_parameters():
                    g = used[s][name].grad
                    p.grad = g.clone() if p.grad is None else p.grad + g
                    used[s][name].grad = None
            if (i + 1) % every == 0:
                grads = {name: p.grad.detach().cpu().clone()
                         for name, p in named_parameters(stages).items()}
                for s in range(pp):
                    optimizers[s].step()
                    optimizers[s].zero_grad(set_to_none=True)
                    versions[s].append(_copy(stages[s]))
    return grads, {name: p.detach().cpu().clone()
                   for name, p in named_parameters(stages).items()}


def _copy(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone().requires_grad_() for name, p in module.named_parameters()}
