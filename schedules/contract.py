"""The execution contract: what each op waits for. Both backends obey exactly this.

Rules (DESIGN.md, "The execution contract"):
- a rank's ops are taken in program order; compute ops run one at a time on one stream;
- `F(s,m)` waits for `RECV_F(s,m)` unless `s` is the first stage;
- `B(s,m)` and `I(s,m)` wait for `F(s,m)` and, unless `s` is the last stage, `RECV_B(s,m)`;
- `W(s,m)` waits for `I(s,m)`;
- `SEND_F(s,m)` waits for `F(s,m)`; `SEND_B(s,m)` for the input gradient of `(s,m)`;
- a DP gradient collective of stage s waits for the weight gradients of every microbatch;
- communication ops are *posted* when the program reaches them and do not block the
  stream; a P2P transfer starts when both its SEND and its RECV are posted, and the RECV
  completes when the transfer does; a collective starts when every member has posted it
  and the member's previous collective on the same group has finished (NCCL runs a
  communicator's operations in issue order).

`B` is `I` and `W` fused, so a completed `B` also satisfies waits on `I` and `W`: the
contract speaks of data products, and `B` produces both.
"""
from __future__ import annotations

from collections.abc import Sequence

from .ops import Op, OpKind

Key = tuple[OpKind, int, int | None]


def prerequisites(op: Op, stage_ranks: Sequence[int],
                  num_microbatches: int | None = None) -> tuple[Key, ...]:
    """Keys of the ops that must have *completed* before `op` may start (or be posted).

    `stage_ranks[s]` is the rank holding stage `s`. Where two neighbouring stages sit on
    the same rank there is no transfer, and the consumer waits for the producer directly.
    A data-parallel gradient collective of stage s (`ALL_REDUCE`/`REDUCE_SCATTER` with
    group 'dp') waits for the weight gradients of all `num_microbatches` microbatches.
    """
    s, m = op.stage, op.microbatch
    kind = op.kind
    last = len(stage_ranks) - 1
    if kind is OpKind.F:
        if s == 0:
            return ()
        local = stage_ranks[s - 1] == stage_ranks[s]
        return ((OpKind.F, s - 1, m) if local else (OpKind.RECV_F, s, m),)
    if kind in (OpKind.B, OpKind.I):
        needs = [(OpKind.F, s, m)]
        if s < last:
            local = stage_ranks[s + 1] == stage_ranks[s]
            needs.append((OpKind.I, s + 1, m) if local else (OpKind.RECV_B, s, m))
        return tuple(needs)
    if kind is OpKind.W:
        return ((OpKind.I, s, m),)
    if kind is OpKind.SEND_F:
        return ((OpKind.F, s, m),)
    if kind is OpKind.SEND_B:
        return ((OpKind.I, s, m),)
    if kind in (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER) and op.group == "dp" and num_microbatches:
        return tuple((OpKind.W, s, mb) for mb in range(num_microbatches))
    return ()


def produces(op: Op) -> tuple[Key, ...]:
    """Keys that the completion of `op` satisfies (a full `B` also yields `I` and `W`)."""
    if op.kind is OpKind.B:
        return (op.key, (OpKind.I, op.stage, op.microbatch), (OpKind.W, op.stage, op.microbatch))
    return (op.key,)


def p2p_peer(op: Op) -> Key:
    """The key of the other end of a P2P op: SEND_F(s,m) pairs with RECV_F(s+1,m), etc."""
    s, m = op.stage, op.microbatch
    if op.kind is OpKind.SEND_F:
        return (OpKind.RECV_F, s + 1, m)
    if op.kind is OpKind.RECV_F:
        return (OpKind.SEND_F, s - 1, m)
    if op.kind is OpKind.SEND_B:
        return (OpKind.RECV_B, s - 1, m)
    if op.kind is OpKind.RECV_B:
        return (OpKind.SEND_B, s + 1, m)
    raise ValueError(f"{op} is not a P2P op")
