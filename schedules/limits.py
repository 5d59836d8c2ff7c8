"""Size limits, checked before any expensive work so that a typo cannot hang the machine
(issue 15). Each limit is far above what a real job needs, names itself in its error, and
says how to go past it where going past it is meaningful.

- MAX_OPS: the ops of one replayed iteration, estimated from (virtual stages x
  microbatches) before a schedule is built (OPS_PER_STAGE_MICROBATCH per pair: F, B or
  I + W, two P2P pairs and the intra-layer collectives of each compute op). 2,000,000 is
  about a minute of replay and a few GB on a 2-core machine; the largest benchmarked run
  (benchmarks/sim_speed.py, P = 64, M = 512) has 194,560. `--max-ops` raises it.
- MAX_LAYERS: transformer layers of a model. The largest published dense models have
  about 200 (SC21's 1T: 128); 10,000 leaves room for experiments while keeping per-layer
  work (layer groups, per-layer roles) bounded.
- MAX_DIMENSION: any other model dimension or count (hidden size, sequence, vocabulary,
  ...) and parallel degree: 10^9 keeps every FLOP and byte count a finite float.
- MAX_GRID_CELLS: the rank x step grid `show` prints and a deadlock report draws:
  10,000,000 cells is about 50 MB of text; above it the grid is refused (show) or left
  out of the report (a deadlock is still reported, with each rank's stuck op).
- MAX_OP_SECONDS: a time given for one op (uniform costs, a profile): 10^6 s (11.6 days)
  is no op of a real iteration, and keeps every sum of them finite.
"""
from __future__ import annotations

from .errors import ConfigError

MAX_OPS = 2_000_000
OPS_PER_STAGE_MICROBATCH = 16
MAX_LAYERS = 10_000
MAX_DIMENSION = 10 ** 9
MAX_OP_SECONDS = 1e6
MAX_GRID_CELLS = 10_000_000


def check_dimension(name: str, value: int) -> None:
    """ConfigError when a count or dimension exceeds MAX_DIMENSION."""
    if value > MAX_DIMENSION:
        raise ConfigError(f"{name}={value} is above the limit of {MAX_DIMENSION:,} "
                          f"(schedules.limits.MAX_DIMENSION)")


def estimated_ops(num_stages: int, microbatches: int) -> int:
    """An upper estimate of one iteration's ops: OPS_PER_STAGE_MICROBATCH per (virtual
    stage, microbatch)."""
    return OPS_PER_STAGE_MICROBATCH * num_stages * microbatches


def check_op_budget(num_stages: int, microbatches: int, max_ops: int = MAX_OPS) -> None:
    """ConfigError when the schedule of `num_stages` x `microbatches` would exceed
    `max_ops` (module docstring), before anything is built."""
    estimate = estimated_ops(num_stages, microbatches)
    if estimate > max_ops:
        raise ConfigError(
            f"{num_stages} stages x {microbatches} microbatches make about {estimate:,} ops "
            f"per iteration, above the limit of {max_ops:,} (--max-ops; about a minute of "
            f"replay per 2,000,000 ops): lower --microbatches / --global-batch-size or "
            f"--pp, or raise --max-ops")
