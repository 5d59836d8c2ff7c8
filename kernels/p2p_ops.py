"""Point-to-point ops of a rank's program (a mixin of kernels.executor.RankExecutor):
SEND_F/SEND_B as `dist.isend`, RECV_F/RECV_B as `dist.irecv`, posted when the program
reaches them; forward and backward traffic on separate process groups ('p2p_f',
'p2p_b'), so one direction never queues behind the other. Both ends derive the peer and
the tag from (direction, stage boundary, microbatch). In loopback (replay) a RECV yields
random data at once and a SEND is dropped. Units: bytes (activation b*s*h elements).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from clustersim.schedules.contract import p2p_peer
from clustersim.schedules.names import RECV_LANE, SEND_LANE
from clustersim.schedules.ops import Op, OpKind
from clustersim.schedules.p2p import boundary


def key_text(key: tuple) -> str:
    """An op key in the IR's text form: (kind, stage, microbatch[, chunk]) -> '1F0.2'."""
    kind, stage, microbatch = key[:3]
    chunk = f".{key[3]}" if len(key) > 3 else ""
    return f"{stage}{kind.value}{'' if microbatch is None else microbatch}{chunk}"


def nbytes_of(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class P2POps:
    """Mixin: the SEND/RECV handlers and the RECV hand-off to the consuming op."""

    def _is_local(self, stage: int) -> bool:
        return self.schedule.rank_of_stage(stage) == self.setup.pipeline_rank

    def _p2p_args(self, op: Op) -> tuple[int, Any, int]:
        """(peer global rank, process group, tag) of a P2P op; both ends compute the same
        group and tag from (direction, boundary, microbatch)."""
        _, peer_stage, m = p2p_peer(op)
        peer = self.setup.pp_ranks[self.schedule.rank_of_stage(peer_stage)]
        forward = op.kind in (OpKind.SEND_F, OpKind.RECV_F)
        tag = boundary(op.kind, op.stage) * self.schedule.num_microbatches + m
        return peer, self.setup.groups["p2p_f" if forward else "p2p_b"], tag

    def _send(self, op: Op, state: Any) -> None:
        s, m = op.stage, op.microbatch
        if op.kind is OpKind.SEND_F:
            tensor = state.chunks[(s, m, self.groups - 1)][1].detach().contiguous()
        else:
            tensor = state.input_grads.pop((s, m)).contiguous()
        if self.setup.loopback:
            return
        peer, group, tag = self._p2p_args(op)
        start = self.clock.mark()
        work = dist.isend(tensor, peer, group=group, tag=tag)
        self._post(op, SEND_LANE, work, tensor, nbytes_of(tensor), start, {"peer": peer})

    def _recv(self, op: Op, state: Any) -> None:
        state.posted.add(op.key)
        if self.setup.loopback:
            buffer = torch.randn(self.activation_shape, dtype=self.dtype, device=self.device)
            state.recvs[op.key] = (None, buffer)
            return
        buffer = torch.empty(self.activation_shape, dtype=self.dtype, device=self.device)
        peer, group, tag = self._p2p_args(op)
        start = self.clock.mark()
        work = dist.irecv(buffer, peer, group=group, tag=tag)
        state.recvs[op.key] = (self._post(op, RECV_LANE, work, buffer, nbytes_of(buffer), start,
                                          {"peer": peer}), buffer)

    def _take_recv(self, key: tuple, state: Any) -> torch.Tensor:
        done, buffer = state.recvs.pop(key)
        if done is not None:  # None: a loopback RECV, ready at once
            self._wait(done, f"waiting for {key_text(key)}")
        return buffer
