"""`simulate`'s checkpoint and failure flags (sim.resilience): any of them adds the
checkpoint plan and expected goodput of a long run to the summary and the metrics JSON;
none given, no such section (the defaults are Llama 3's, sim.resilience)."""
from __future__ import annotations

import argparse

from ..resilience import CHECKPOINT_GBPS, GPU_MTBF_HOURS, Resilience


def add_resilience_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "failures and checkpoints (any of these adds the goodput of a long run)")
    group.add_argument("--goodput", action="store_true",
                       help="report the checkpoint plan and expected goodput at the defaults "
                            "below")
    group.add_argument("--gpu-mtbf-hours", type=float, metavar="H",
                       help=f"mean time between failures of one GPU, hours (default "
                            f"{GPU_MTBF_HOURS:,.0f}: Llama 3's 419 interruptions in 54 days "
                            f"on 16,384 GPUs); the job's is this / its GPUs")
    group.add_argument("--checkpoint-gbps", type=float, metavar="GB/S",
                       help=f"checkpoint write and read bandwidth per GPU, GB/s (default "
                            f"{CHECKPOINT_GBPS:.4g}: Tectonic's 2 TB/s over Llama 3's 16,384 "
                            f"GPUs)")
    group.add_argument("--restart-overhead-s", type=float, metavar="S",
                       help="seconds to relaunch the job after a failure, beyond loading the "
                            "checkpoint (default 0: no published figure)")
    group.add_argument("--checkpoint-every", type=int, metavar="N",
                       help="iterations between checkpoints (default: Daly's optimum)")


FIELDS = ("gpu_mtbf_hours", "checkpoint_gbps", "restart_overhead_s", "checkpoint_every")
"""Resilience's fields, each set by the flag of its name (--gpu-mtbf-hours, ...)."""


def resilience_from_args(args: argparse.Namespace) -> Resilience | None:
    """The settings the flags give, or None when none of them is given."""
    given = {name: getattr(args, name) for name in FIELDS if getattr(args, name) is not None}
    if not given and not args.goodput:
        return None
    return Resilience(**given)
