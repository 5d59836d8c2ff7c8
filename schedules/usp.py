"""USP's two levels of context parallelism (Fang & Zhao 2024, "USP: A Unified Sequence
Parallelism Approach for Long Context Generative AI", arXiv 2405.07719; Megatron-Core's
--cp-comm-type a2a+p2p with --hierarchical-context-parallel-sizes A R): the cp ranks form
R ring steps of A Ulysses ranks each, cp = A * R. As Megatron-Core groups them ("every
two adjacent gpus forms the first level of cp groups", for sizes 2 4), a 'cp_a2a' group
is A consecutive cp coordinates and a 'cp_ring' group the ranks at one place in every
block. The communication is schedules.cp_comms'.
"""
from __future__ import annotations

from .errors import ConfigError
from .names import CP_A2A, CP_RING
from .nested_groups import across_blocks, block_of


def check_usp_sizes(cp_comm: str, cp: int, cp_a2a: int | None) -> None:
    """ConfigError unless `cp_a2a` is given exactly for 'usp', splitting cp into A > 1
    Ulysses ranks times R > 1 ring steps."""
    if cp_comm != "usp":
        if cp_a2a is not None:
            raise ConfigError(f"cp_a2a={cp_a2a} sizes USP's Ulysses level: it needs "
                              f"cp_comm='usp' (Megatron's --cp-comm-type a2a+p2p), got "
                              f"cp_comm={cp_comm!r}")
        return
    if isinstance(cp_a2a, bool) or not isinstance(cp_a2a, int) or not 1 < cp_a2a < cp \
            or cp % cp_a2a:
        raise ConfigError(f"cp_comm='usp' needs cp_a2a (the Ulysses ranks of each ring step; "
                          f"--hierarchical-context-parallel-sizes A R) to divide cp={cp} with "
                          f"1 < cp_a2a < cp, got {cp_a2a!r} (cp_a2a = cp is 'ulysses', 1 is "
                          f"'ring')")


def usp_group(cp_group: list[int], rank: int, cp_a2a: int, axis: str) -> list[int]:
    """`rank`'s 'cp_a2a' or 'cp_ring' group within its cp group (module docstring)."""
    if axis == CP_A2A:
        return block_of(cp_group, rank, cp_a2a)
    if axis == CP_RING:
        return across_blocks(cp_group, rank, cp_a2a)
    raise ConfigError(f"unknown USP group {axis!r}: {CP_A2A} or {CP_RING}")
