"""Single-process data parallelism: torch.nn.DataParallel (`ParallelConfig.dp_impl`
'dataparallel'), the seeds' first data-parallel picture and its bottleneck on GPU 0.

What one forward and backward call does on N GPUs of one host (torch
nn/parallel/data_parallel.py, replicate.py, comm.py; docs/research/
data_parallel_single_process.md):
- replicate: every call broadcasts all parameters (and buffers) from GPU 0 to the others
  (`broadcast_coalesced`, NCCL ncclBcast, in coalesced buckets of 10 MiB: REPLICATE_BUCKET)
  before any replica computes;
- scatter the inputs from GPU 0, run the N replicas in threads, gather the outputs (here
  each replica's loss) on GPU 0;
- backward: every replica's gradients are summed onto GPU 0 (`reduce_add_coalesced`, NCCL
  ncclReduce, same buckets) once every replica's whole backward has ended: the reduce
  overlaps nothing, and `loss.backward()` returns after it;
- the optimizer step runs on GPU 0 only, which alone holds gradients and optimizer states.
NCCL runs broadcast and reduce as pipelined chains along a ring (sim.collective_algorithms:
S over the slowest hop plus (N-1) latencies each).

As ops (`add_single_process`): per microbatch (one forward call) BROADCAST(params) over
'dp', F, B, REDUCE(gradients) over 'dp'; then one OPT_STEP. The contract makes F wait for
its broadcast and the next broadcast for the previous reduce (schedules.contract). The
replayed rank is GPU 0 (dp rank 0), the one that steps; the others' memory (no gradients
kept, no optimizer states) is less than the replayed rank's, which the run notes.
Not simulated, stated in the run's notes: the scatter of the token ids (b s 8 bytes per
replica) and the gather of one loss per replica (both under 1 ms on NVLink), and the
Python threads' GIL contention the PyTorch docs name (pytorch/tutorials ddp_tutorial.rst,
"Comparison between DataParallel and DistributedDataParallel").
"""
from __future__ import annotations

import math

from .errors import ConfigError
from .names import DP
from .ops import WEIGHT_GRAD_KINDS, Op, OpKind
from .schedule import Schedule

DP_IMPLS = ("ddp", "dataparallel")
REPLICATE_BUCKET = 10 * 2 ** 20  # bytes: torch replicate's / reduce_add_coalesced's buffer


def check_single_process(parallel) -> None:
    """torch.nn.DataParallel replicates one process's module over the GPUs of one host:
    no other parallelism, no sharding (checked on a ParallelConfig)."""
    if parallel.dp_impl not in DP_IMPLS:
        raise ConfigError(f"dp_impl={parallel.dp_impl!r} must be one of {', '.join(DP_IMPLS)}")
    if parallel.dp_impl != "dataparallel":
        return
    found = [f"{name}={getattr(parallel, name)}" for name in ("pp", "vpp", "tp", "cp", "ep")
             if getattr(parallel, name) not in (1, None)]
    found += [f"{name}={getattr(parallel, name)!r}" for name, off in (
        ("zero_stage", 0), ("fsdp", "none"), ("offload", False)) if getattr(parallel, name) != off]
    if parallel.bucket_bytes is not None:
        raise ConfigError(f"bucket_bytes={parallel.bucket_bytes} sizes DDP's gradient buckets; "
                          f"torch.nn.DataParallel coalesces its broadcast and reduce in "
                          f"{REPLICATE_BUCKET // 2 ** 20} MiB buffers of its own (leave it unset)")
    if parallel.dp == 1:
        found.append("dp=1 (no replica: one GPU runs the module as it is)")
    if found:
        raise ConfigError(f"dp_impl='dataparallel' (torch.nn.DataParallel) replicates one "
                          f"process's whole module over dp > 1 GPUs: it needs pp = vpp = tp = "
                          f"cp = ep = 1 and no ZeRO, FSDP or offload, got {', '.join(found)}")


def check_one_host(plan) -> None:
    """The replicas are threads of one process: every GPU of the job on one host. LoRA is
    refused: replicate broadcasts every parameter, frozen ones too, which the
    data-parallel sizes (the trained adapters') do not count."""
    if plan.parallel.dp_impl != "dataparallel":
        return
    if plan.model.lora:
        raise ConfigError(f"dp_impl='dataparallel' with lora_rank={plan.model.lora_rank}: "
                          f"torch.nn.DataParallel broadcasts the frozen base weights too, "
                          f"which this model does not count; use DDP (dp_impl 'ddp')")
    if plan.groups_spanning_hosts(DP):
        raise ConfigError(f"dp_impl='dataparallel' (torch.nn.DataParallel) is one process on "
                          f"one host: its dp={plan.parallel.dp} GPUs span several hosts of the "
                          f"topology; use DDP (dp_impl 'ddp') across hosts")


def add_single_process(schedule: Schedule, param_bytes: int, grad_bytes: int,
                       step: list[Op]) -> Schedule:
    """The program of torch.nn.DataParallel (module docstring): `param_bytes` broadcast
    before every forward, `grad_bytes` reduced after every backward, then `step`."""
    def collective(kind: OpKind, microbatch: int, nbytes: int) -> Op:
        return Op(kind, 0, microbatch, DP, nbytes,
                  count=max(1, math.ceil(nbytes / REPLICATE_BUCKET)))

    programs = []
    for program in schedule.programs:
        out: list[Op] = []
        for op in program:
            if op.kind is OpKind.F:
                out.append(collective(OpKind.BROADCAST, op.microbatch, param_bytes))
            out.append(op)
            if op.kind in WEIGHT_GRAD_KINDS:  # B, or W of a split backward
                out.append(collective(OpKind.REDUCE, op.microbatch, grad_bytes))
        programs.append(out + step)
    return schedule.with_programs(programs)


def single_process_notes(plan) -> list[str]:
    """What a torch.nn.DataParallel run assumes (module docstring)."""
    if plan.parallel.dp_impl != "dataparallel":
        return []
    model = plan.model
    return [f"torch.nn.DataParallel: GPU 0 is replayed (it broadcasts the parameters before "
            f"every forward, receives the summed gradients after every backward and alone "
            f"steps); the other {plan.parallel.dp - 1} GPUs keep no gradients or optimizer "
            f"states, so their memory is below GPU 0's. Not simulated: the scatter of the "
            f"token ids ({model.micro_batch_size * model.seq_length * 8} bytes per replica "
            f"per forward), the gather of one loss per replica, and the replica threads' GIL "
            f"contention"]
