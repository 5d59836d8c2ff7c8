"""SimPy replay of a lowered schedule under the execution contract (schedules.contract).

One SimPy process per rank walks its program: a compute op waits for its prerequisites,
then holds the rank's single compute stream for the cost model's duration; a P2P op is
*posted* without blocking the stream, and a transfer starts through the network seam as
soon as both of its ends are posted. Everything the replay observes goes into a Timeline
(seconds; memory in bytes). If processes remain blocked when no event is left, the replay
raises DeadlockError naming each rank's stuck op.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import simpy

from schedules.contract import Key, p2p_peer, prerequisites, produces
from schedules.errors import ConfigError, DeadlockError
from schedules.ops import Op, OpKind
from schedules.schedule import Schedule
from schedules.timeline import COMPUTE_LANE, MemorySample, Span, Timeline

from .network import Network

SEND_LANE, RECV_LANE = "send", "recv"


@dataclass(frozen=True)
class MemoryModel:
    """Per-rank bytes: `static[r]` held all iteration; each forward of stage s adds
    `activations[s]`, released when its last backward op (B, or W after I) ends."""

    static: Sequence[int]
    activations: Sequence[int]


class Replay:
    """Replays `schedule` (lowered, with P2P ops) on `devices[r]` for pipeline rank r."""

    def __init__(self, env: simpy.Environment, schedule: Schedule, devices: Sequence[str],
                 compute_time: Callable[[Op], float], network: Network,
                 memory: MemoryModel | None = None,
                 collective: Callable[[Op, int], simpy.Event] | None = None):
        self.env, self.schedule, self.devices = env, schedule, devices
        self.compute_time, self.network, self.memory = compute_time, network, memory
        self.collective = collective
        self.last_collective: dict[tuple[int, str | None], simpy.Event] = {}
        self.done: set[Key] = set()
        self.waiting: dict[Key, simpy.Event] = {}  # events exist only for awaited keys
        self.posted: dict[Key, tuple[int, Op, float]] = {}
        self.spans: list[Span] = []
        self.samples: list[MemorySample] = []
        self.pc = [0] * schedule.num_ranks
        self.allocated = [0] * schedule.num_ranks
        self.split_backward = {(op.stage, op.microbatch)
                               for op in schedule.ops() if op.kind is OpKind.W}

    def _complete(self, op: Op) -> None:
        for key in produces(op):
            self.done.add(key)
            ev = self.waiting.pop(key, None)
            if ev is not None:
                ev.succeed()

    def _allocate(self, rank: int, nbytes: int) -> None:
        if nbytes:
            self.allocated[rank] += nbytes
            self.samples.append(MemorySample(rank, self.env.now, self.allocated[rank]))

    def _releases_activations(self, op: Op) -> bool:
        if op.kind is OpKind.B or op.kind is OpKind.W:
            return True
        return op.kind is OpKind.I and (op.stage, op.microbatch) not in self.split_backward

    def _run_rank(self, rank: int):
        env, ranks = self.env, self.schedule.stage_ranks
        for op in self.schedule.programs[rank]:
            for key in prerequisites(op, ranks, self.schedule.num_microbatches):
                if key not in self.done:
                    ev = self.waiting.get(key)
                    if ev is None:
                        ev = self.waiting[key] = env.event()
                    yield ev
            if op.kind.is_compute:
                start = env.now
                if op.kind is OpKind.F and self.memory:
                    self._allocate(rank, self.memory.activations[op.stage])
                yield env.timeout(self.compute_time(op))
                self.spans.append(Span(rank, COMPUTE_LANE, op, start, env.now))
                if self.memory and self._releases_activations(op):
                    self._allocate(rank, -self.memory.activations[op.stage])
                self._complete(op)
            elif op.kind.is_p2p:
                self._post(rank, op)
            elif op.kind.is_collective:
                self._start_collective(rank, op)
            self.pc[rank] += 1

    def _post(self, rank: int, op: Op) -> None:
        self.posted[op.key] = (rank, op, self.env.now)
        peer_key = p2p_peer(op)
        if peer_key not in self.posted:
            return
        peer_rank, peer_op, _ = self.posted[peer_key]
        if op.kind in (OpKind.SEND_F, OpKind.SEND_B):
            (src, send), (dst, recv) = (rank, op), (peer_rank, peer_op)
        else:
            (src, send), (dst, recv) = (peer_rank, peer_op), (rank, op)
        start = self.env.now
        done = self.network.transfer(self.devices[src], self.devices[dst], send.nbytes)

        def finish(_event: simpy.Event) -> None:
            end = self.env.now
            info = {"peer": dst, "bandwidth_Bps": send.nbytes / (end - start)
                    if end > start else None}
            self.spans.append(Span(src, SEND_LANE, send, start, end, info))
            self.spans.append(Span(dst, RECV_LANE, recv, start, end, {"peer": src}))
            self._complete(send)
            self._complete(recv)

        done.callbacks.append(finish)

    def _start_collective(self, rank: int, op: Op) -> None:
        """Run `op` after this rank's previous collective on the same group (NCCL issue
        order). The other members are this program rank in the other replicas, which by
        symmetry post it at the same moment. `collective(op, rank)` returns an event whose
        value is the span's hover info (algorithm, bus bandwidth, ...)."""
        if self.collective is None:
            raise ConfigError(f"rank {rank}: op {op} is a collective, but this replay has no "
                              "collective model")
        lane = (rank, op.group)
        previous = self.last_collective.get(lane)
        done = self.env.event()
        self.last_collective[lane] = done

        def start(_event: simpy.Event | None = None) -> None:
            begin = self.env.now
            running = self.collective(op, rank)

            def finish(event: simpy.Event) -> None:
                info = event.value if isinstance(event.value, dict) else None
                self.spans.append(Span(rank, op.group or "coll", op, begin, self.env.now, info))
                self._complete(op)
                done.succeed()

            running.callbacks.append(finish)

        if previous is None or previous.processed:
            start()
        else:
            previous.callbacks.append(start)

    def run(self) -> Timeline:
        if self.memory:
            for rank, nbytes in enumerate(self.memory.static):
                self._allocate(rank, nbytes)
        for rank in range(self.schedule.num_ranks):
            self.env.process(self._run_rank(rank))
        self.env.run()
        self._raise_if_stuck()
        self.spans.sort(key=lambda s: (s.start, s.rank))
        return Timeline(self.spans, self.samples, source="sim")

    def _raise_if_stuck(self) -> None:
        programs = self.schedule.programs
        stuck = {r: programs[r][pc] for r, pc in enumerate(self.pc) if pc < len(programs[r])}
        if not stuck:
            return
        lines = []
        for rank, op in stuck.items():
            missing = [k for k in prerequisites(op, self.schedule.stage_ranks,
                                                self.schedule.num_microbatches)
                       if k not in self.done]
            waits = ", ".join(f"{s}{k.value}{m}" for k, s, m in missing)
            lines.append(f"rank {rank} stuck at {op} (step {self.pc[rank]}) waiting for {waits}")
        report = "\n".join(
            f"rank {r}: " + " ".join(
                f">{op}<" if i == self.pc[r] else str(op) for i, op in enumerate(p)
            ) for r, p in enumerate(programs)
        )
        raise DeadlockError("deadlock in simulation: " + "; ".join(lines), stuck, report)
