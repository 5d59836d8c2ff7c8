"""Checks made before any rank process starts, so bad input fails at once instead of
exhausting the machine or measuring for minutes first (issue 15).

- `check_local_ranks(count, what)`: a run starts one process per rank on this host
  (each imports torch: a few hundred MB resident; on CUDA each needs its own GPU), so
  more than `local_rank_limit()` processes are refused. The limit is MAX_LOCAL_RANKS
  (64: eight 8-GPU nodes' worth, far above one host's GPUs) unless the environment
  variable CLUSTERSIM_MAX_LOCAL_RANKS sets another.

It raises ConfigError with one line naming the flag or field and the rule. Output paths
are checked by schedules.output_files.check_outputs, also before any process starts.
"""
from __future__ import annotations

import os

from clustersim.schedules.errors import ConfigError

MAX_LOCAL_RANKS = 64
LIMIT_ENV = "CLUSTERSIM_MAX_LOCAL_RANKS"


def local_rank_limit() -> int:
    """The most rank processes one run may start on this host: $CLUSTERSIM_MAX_LOCAL_RANKS
    if set (a positive integer), else MAX_LOCAL_RANKS."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return MAX_LOCAL_RANKS
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ConfigError(f"{LIMIT_ENV}={text!r} must be a positive integer")
    return limit


def check_local_ranks(count: int, what: str) -> None:
    """Refuse a run of `count` rank processes above the limit; `what` names the flag or
    field that set it (e.g. '--ranks=100000')."""
    limit = local_rank_limit()
    if count > limit:
        source = (f"${LIMIT_ENV}" if os.environ.get(LIMIT_ENV, "").strip()
                  else "kernels.preflight.MAX_LOCAL_RANKS")
        raise ConfigError(f"{what} would start {count} rank processes on this host; the "
                          f"limit is {limit} ({source}; set {LIMIT_ENV} to raise it)")
