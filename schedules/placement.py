"""Placement: which pipeline rank holds each virtual stage (model chunk).

- 'loop' (Megatron-LM, torch.distributed.pipelining's looped schedules): stage s on rank
  s % P, so rank r holds stages r, r+P, r+2P, ...
- 'v' (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024: ZB-V; DeepSeek-V3's
  DualPipeV): the stages go down the ranks and back up, so rank r holds stages r and
  2P-1-r (and, with more chunks, continues the zig-zag): the first and last stage share
  rank 0.
"""
from __future__ import annotations

from collections.abc import Callable

from .errors import ConfigError

LOOP, V_SHAPE = "loop", "v"


def loop(pp: int, num_stages: int) -> tuple[int, ...]:
    return tuple(s % pp for s in range(num_stages))


def v_shape(pp: int, num_stages: int) -> tuple[int, ...]:
    return tuple(s % pp if (s // pp) % 2 == 0 else pp - 1 - s % pp for s in range(num_stages))


PLACEMENTS: dict[str, Callable[[int, int], tuple[int, ...]]] = {LOOP: loop, V_SHAPE: v_shape}


def stage_ranks(placement: str, pp: int, num_stages: int) -> tuple[int, ...]:
    """Rank of each of `num_stages` stages over `pp` ranks under `placement`."""
    if placement not in PLACEMENTS:
        raise ConfigError(f"placement={placement!r} must be one of {', '.join(PLACEMENTS)}")
    if num_stages % pp:
        raise ConfigError(f"{num_stages} stages do not split evenly over pp={pp} ranks")
    return PLACEMENTS[placement](pp, num_stages)


def stages_by_rank(placement: str, pp: int, num_stages: int) -> list[list[int]]:
    """The stages each rank holds under `placement`, in stage order (a rank's model chunks
    0, 1, ...): what schedule generators number their ops by."""
    held: list[list[int]] = [[] for _ in range(pp)]
    for s, r in enumerate(stage_ranks(placement, pp, num_stages)):
        held[r].append(s)
    return held
