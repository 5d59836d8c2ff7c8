"""The optimizer step of the kernels backend (OPT_STEP): Adam on a flat fp32 shard.

Adam (Kingma & Ba 2015) exactly as torch.optim.Adam's single-tensor path computes it
(torch/optim/adam.py, `_single_tensor_adam`, no weight decay, no amsgrad):
    m = m + (1 - beta1) (g - m)          v = beta2 v + (1 - beta2) g^2
    p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
Every operation is elementwise, so stepping each rank's 1/N shard of a flat parameter
vector equals stepping the whole vector: that is why ZeRO can shard the optimizer state
(Rajbhandari et al. SC20) and why `torch.optim.Adam` on the full parameters in one
process (`reference_step`) is an independent reference for the sharded step.

The hyperparameters are fixed (ADAM): the IR's OPT_STEP carries no optimizer settings.
Master weights and the two moments are fp32 whatever the model dtype (mixed-precision
Adam, K = 12 bytes per parameter); units: elements of flat 1-D tensors.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AdamConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


ADAM = AdamConfig()  # torch.optim.Adam's defaults


class FlatAdam:
    """Adam state (fp32 master weights, m, v, step count) of one flat shard."""

    def __init__(self, master: torch.Tensor, config: AdamConfig = ADAM):
        self.config = config
        self.master = master.detach().to(torch.float32).clone()
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.steps = 0

    @torch.no_grad()
    def step(self, grad: torch.Tensor) -> torch.Tensor:
        """Update the master shard with `grad` (same length); returns the master shard."""
        if grad.shape != self.master.shape:
            raise ValueError(f"gradient shard of {tuple(grad.shape)} elements for a master "
                             f"shard of {tuple(self.master.shape)}")
        c = self.config
        beta1, beta2 = c.betas
        g = grad.to(torch.float32)
        self.steps += 1
        self.exp_avg.lerp_(g, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = c.lr / (1 - beta1 ** self.steps)
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** self.steps)).add_(c.eps)
        self.master.addcdiv_(self.exp_avg, denom, value=-step_size)
        return self.master


def reference_optimizer(params: Iterable[torch.nn.Parameter],
                        config: AdamConfig = ADAM) -> torch.optim.Adam:
    """torch.optim.Adam with the same hyperparameters (single-tensor path): the
    single-process reference for OPT_STEP."""
    return torch.optim.Adam(params, lr=config.lr, betas=config.betas, eps=config.eps,
                            foreach=False)
