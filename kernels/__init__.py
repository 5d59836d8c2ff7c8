"""The same schedules on real devices with torch.distributed (gloo on CPU, NCCL on GPUs),
returning measured Timelines. Imports schedules and torch only — never sim or topologies
(docs/architecture.md). Install torch with `pip install -e '.[kernels]'`.

- `run_schedule(schedule, plan, device='cpu', ...)`: lowers the schedule for the plan
  (schedules.plan.resolve, schedules.lowering), runs its ops in one process per rank
  (real transformer-layer forward/backward, P2P isend/irecv, DP gradient all-reduce, ZeRO
  reduce-scatter / all-gather, Adam steps) and returns the measured Timeline (`source`
  'kernels:cpu' or 'kernels:cuda:<device name>'), optionally with the gradients and the
  updated parameters.
- `run_reference(model, parallel, seed)`: the single-process gradients every pipelined run
  must reproduce; `run_reference_steps` the same with torch.optim.Adam steps;
  `run_stale_reference(plan, run)` an asynchronous schedule's (PipeDream, 2BW) on the
  same stale weight versions (kernels.stashing runs them).
- `KernelsError`: a failed run, naming the rank and the op.

Rank processes die with the process that started them, meet on a loopback-only store,
and are refused above kernels.preflight's limit before any starts; `timeout` is a
no-progress watchdog (kernels.lifecycle, kernels.rendezvous, kernels.watchdog).

Supported so far: pipeline (any schedule of F/B/I/W with P2P ops, layer groups), data
parallelism (DDP, ZeRO 1-3, FSDP/HSDP ops over 'dp', 'dp_shard', 'dp_replicate', OPT_STEP)
and tensor parallelism with or without sequence parallelism (Megatron column/row-parallel
layers, vocab-parallel embedding and cross-entropy; kernels.tensor_parallel, the IR's 'tp'
ops as measured spans: kernels.tp_ops), or on a grid: Optimus' 2D (tp_mode '2d': SUMMA
products, kernels.summa, kernels.layers_2d, kernels.stage_2d), Tesseract's 2.5D (d such
grids, kernels.linear_nd.Grid25D) and Colossal-AI's 3D (kernels.linear_nd, layers_3d,
stage_3d), with the IR's ops on the grid's groups; cp, ep, MoE, fp8, LoRA, ZeRO++,
offload and ZeRO-R's partitioned activations are not (a clear error says so).
"""
from .errors import KernelsError
from .launch import run_reference, run_reference_steps, run_schedule, run_stale_reference

__all__ = ["KernelsError", "run_reference", "run_reference_steps", "run_schedule",
           "run_stale_reference"]
