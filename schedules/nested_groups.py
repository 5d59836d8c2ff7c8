"""A group split into two levels: blocks of `inner` consecutive members, and the members at
one place of every block. HSDP and ZeRO++ hpZ shard inside a block and replicate across
(schedules.sharding); USP runs Ulysses inside a block and a ring across (schedules.usp)."""
from __future__ import annotations


def block_of(group: list[int], member: int, inner: int) -> list[int]:
    """The `inner` consecutive members of `group` that hold `member`."""
    start = group.index(member) // inner * inner
    return group[start:start + inner]


def across_blocks(group: list[int], member: int, inner: int) -> list[int]:
    """The members of `group` at `member`'s place in every block of `inner`."""
    return group[group.index(member) % inner::inner]
