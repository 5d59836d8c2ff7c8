"""How many transformer layers each pipeline stage holds (Megatron-Core's split).

Default: num_layers / num_stages each (must divide). Uneven splits, for the first and last
stages that also hold the embedding and the output layer with its loss (Megatron-Core
arguments and `get_transformer_layer_offset`):
- `first_stage_layers` / `last_stage_layers` (--decoder-first/last-pipeline-num-layers):
  the first / last PIPELINE RANK holds that many layers, spread evenly over its vpp
  virtual stages; the other ranks split the rest evenly.
- `account_for_embedding` / `account_for_loss` (--account-for-embedding-in-pipeline-split,
  --account-for-loss-in-pipeline-split): the embedding / the loss counts as one layer, so
  num_layers + 1 (or + 2) slots split evenly over the virtual stages and the first / last
  virtual stage holds one layer fewer.
Which pipeline rank holds virtual stage s is the schedule's placement (`stage_ranks`,
schedules.placement: s % pp for the loop, a V for ZB-V); layers follow stage order.
Every stage keeps at least one layer. schedules.plan calls this once per run; everything
else reads Plan.stage_layers.
"""
from __future__ import annotations

from collections.abc import Sequence

from .errors import ConfigError


def _even(total: int, parts: int, what: str) -> int:
    if parts <= 0 or total % parts:
        raise ConfigError(f"{what}: {total} layers do not split evenly over {parts}")
    return total // parts


def stage_layers(num_layers: int, parallel, stage_ranks: Sequence[int]) -> tuple[int, ...]:
    """Layers of each virtual stage under `parallel` (a ParallelConfig), stage s on
    pipeline rank `stage_ranks[s]`."""
    num_stages = len(stage_ranks)
    first, last = parallel.first_stage_layers, parallel.last_stage_layers
    slots = int(parallel.account_for_embedding) + int(parallel.account_for_loss)
    if first is None and last is None and not slots:
        if num_layers % num_stages:
            raise ConfigError(f"num_layers={num_layers} is not divisible by num_stages="
                              f"{num_stages} (pp*vpp); set first_stage_layers/"
                              f"last_stage_layers for an uneven split")
        return (num_layers // num_stages,) * num_stages
    pp = parallel.pp
    if pp == 1 or num_stages % pp:
        raise ConfigError(f"an uneven pipeline split needs pp > 1 and pp*vpp stages, got "
                          f"pp={pp} and {num_stages} stages")
    if slots:
        if first is not None or last is not None:
            raise ConfigError("account_for_embedding/account_for_loss cannot be combined with "
                              "first_stage_layers/last_stage_layers (Megatron-Core)")
        per = _even(num_layers + slots, num_stages,
                    "account_for_embedding/account_for_loss (num_layers + the slots)")
        counts = [per] * num_stages
        counts[0] -= int(parallel.account_for_embedding)
        counts[-1] -= int(parallel.account_for_loss)
    else:
        vpp = num_stages // pp
        given = {0: first, pp - 1: last}
        middle = [r for r in range(pp) if given.get(r) is None]
        rest = num_layers - sum(v for v in given.values() if v is not None)
        if rest < 0 or (not middle and rest):
            raise ConfigError(f"first_stage_layers={first} and last_stage_layers={last} must "
                              f"leave the other {len(middle)} pipeline ranks the remaining "
                              f"layers of num_layers={num_layers}")
        per_rank = {r: _even(rest, len(middle), "the layers left for the middle ranks")
                    for r in middle} if middle else {}
        per_rank.update({r: v for r, v in given.items() if v is not None})
        name = {0: "first_stage_layers", pp - 1: "last_stage_layers"}
        counts = [_even(per_rank[r], vpp, f"{name.get(r, 'a middle rank')} over "
                        f"vpp={vpp} virtual stages") for r in stage_ranks]
    if min(counts) < 1:
        raise ConfigError(f"the pipeline split {counts} leaves a stage without layers")
    return tuple(counts)


def stage_offsets(counts: tuple[int, ...]) -> tuple[int, ...]:
    """Index of each stage's first layer (0-based, model order)."""
    offsets, total = [], 0
    for c in counts:
        offsets.append(total)
        total += c
    return tuple(offsets)
