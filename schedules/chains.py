"""Stage chains: the pipelines a schedule's virtual stages form, and which microbatches
run through each.

Most schedules have one chain: every microbatch runs through stages 0, 1, ..., S-1.
DeepSeek's bidirectional DualPipe (DeepSeek-V3 report section 3.2.1; deepseek-ai/DualPipe,
docs/research/dualpipe_bidirectional.md) has two: the model's P stages exist twice, one
copy per direction. Its virtual stages are 0..P-1 (direction 0, stage s on rank s) and
P..2P-1 (direction 1, model stage j as virtual stage P + j on rank P-1-j: the V placement);
microbatches 0..M/2-1 run through the first chain and M/2..M-1 through the second.

With c chains of L = S / c stages, virtual stage s is model stage s % L of chain s // L:
its neighbours are s - 1 and s + 1 inside the chain only, it holds the embedding when
s % L == 0 and the head when s % L == L - 1, and it runs the microbatches of its chain.
Every rule that asks "first stage?", "last stage?", "previous stage?" asks this module.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class StageChains:
    """`chains` chains over `num_stages` virtual stages and `num_microbatches`."""

    num_stages: int
    chains: int = 1
    num_microbatches: int | None = None

    def __post_init__(self) -> None:
        if self.chains < 1 or self.num_stages % self.chains:
            raise ConfigError(f"{self.num_stages} stages do not form {self.chains} chains of "
                              f"equal length")
        if self.num_microbatches is not None and self.num_microbatches % self.chains:
            raise ConfigError(f"{self.num_microbatches} microbatches do not split evenly over "
                              f"{self.chains} stage chains (directions)")

    @property
    def length(self) -> int:
        """L: stages per chain (the model's pipeline stages)."""
        return self.num_stages // self.chains

    def model_stage(self, stage: int) -> int:
        return stage % self.length

    def chain_of(self, stage: int) -> int:
        return stage // self.length

    def is_first(self, stage: int) -> bool:
        return stage % self.length == 0

    def is_last(self, stage: int) -> bool:
        return stage % self.length == self.length - 1

    def previous(self, stage: int) -> int | None:
        return None if self.is_first(stage) else stage - 1

    def next(self, stage: int) -> int | None:
        return None if self.is_last(stage) else stage + 1

    def copy_of(self, stage: int) -> int:
        """The same model stage in the other chain (two chains: DualPipe's copies)."""
        if self.chains != 2:
            raise ValueError(f"a stage has one copy per chain; {self.chains} chains")
        return (stage + self.length) % self.num_stages

    def microbatches_of(self, stage: int) -> range:
        """The microbatches that run through `stage` (all of them with one chain)."""
        if self.num_microbatches is None:
            raise ValueError("StageChains without num_microbatches")
        per = self.num_microbatches // self.chains
        first = self.chain_of(stage) * per
        return range(first, first + per)

    def runs(self, stage: int, microbatch: int) -> bool:
        return microbatch in self.microbatches_of(stage)


def single_chain(num_stages: int, num_microbatches: int | None = None) -> StageChains:
    return StageChains(num_stages, 1, num_microbatches)
