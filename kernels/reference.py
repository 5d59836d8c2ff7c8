"""The single-process reference every distributed run must reproduce: the whole model
in one process on the global batch (mean loss), its gradients and, for schedules with
OPT_STEP, torch.optim.Adam steps (kernels.optimizer.reference_optimizer).
Units: gradients and parameters in the model dtype, by global parameter name.
"""
from __future__ import annotations

import torch

from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import ParallelConfig

from .optimizer import reference_optimizer
from .stage import build_stages, named_parameters, token_batch


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
