"""SimPy replay of a lowered schedule under the execution contract (schedules.contract).

One SimPy process per rank walks its program: a compute op waits for its prerequisites
(keyed and positional: schedules.contract.program_contract), then holds the rank's single
compute stream for the cost model's duration; a P2P op is *posted* without blocking the
stream, and a transfer starts through the network seam as soon as both of its ends are
posted. Other non-compute ops are posted too and run on a lane of their own, in issue
order, once their positional waits are met: collectives on the lane named by their group
(`collective` hook), host copies (COPY_D2H / COPY_H2D: ZeRO-Offload's, ZeRO-R Pa+cpu's
checkpoints) on lane 'pcie' as transfers between the rank's GPU and its host CPU
(`hosts[r]`) through the network seam (an op of count k: k transfers in turn), and an
OPT_STEP with group 'host' (ZeRO-Offload) on lane 'host' for `compute_time(op)`.
A collective's other members are the same pipeline rank in the other replicas, which by
symmetry post it at the same moment, but for DualPipe's all-reduce of a stage's two copies
(group 'pp_copies', schedules.chains), whose members are two replayed ranks: it starts
once both are ready and runs once for both (schedules.contract.copy_peer). The full
replay (`ranks`: ReplayRanks, from sim.world) runs every rank of the job instead: replay
rank r runs its pipeline coordinate's program, keyed completions and P2P pairs are per
replica, and a collective starts once all its group's members have posted it (the n-th
each posts on that lane), runs once for them all, and records on each member's span how
long it waited and for whom (sim.waits); a slow GPU's compute takes `speed[r]` times as
long.
An intra-layer collective flagged `Op.alongside` runs beside the compute op after it
(schedules.contract); a P2P op is posted once its positional waits are met.
Overlap is not free (`slowdown`, per rank; sim.collective_model.overlap_slowdown): while
at least one of a rank's data-parallel collectives runs (sim.collective_model.slows_compute),
its F/B/I/W ops progress at 1 / (1 + f) of their speed, the NCCL kernels holding SMs the
GEMMs lose; re-rated whenever such a collective starts or ends. An op of t seconds that
overlaps collectives for o of its seconds therefore ends after t + o * f / (1 + f): its
work done while overlapped takes (1 + f) times as long, the rest none longer.
Events exist only for things some op waits for. Everything the replay observes goes into
a Timeline (seconds; memory in bytes). If processes remain blocked when no event is
left, the replay raises DeadlockError naming each rank's stuck op. Each op kind goes to
its handler through one table (`Replay._dispatch_table`; docs/architecture.md).
Several replays may share one environment and network (`run_replays`: jobs on one fabric,
sim.shared_fabric); each keeps its own ranks, keys and Timeline.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter

import simpy
from simpy.core import EmptySchedule

from clustersim.schedules.contract import (Key, copy_peer, gather_releases, op_needs,
                                           op_products, p2p_peer, prerequisites,
                                           program_contract, program_needs,
                                           program_products, runs_on_compute_stream)
from clustersim.schedules.errors import ConfigError, DeadlockError
from clustersim.schedules.names import (COMPUTE_LANE, HOST_LANE, PCIE_LANE, PP_COPIES,
                                        RECV_LANE, SEND_LANE, collective_lane)
from clustersim.schedules.ops import (COLLECTIVE_KINDS, COPY_KINDS, P2P_KINDS, WORK_KINDS, Op,
                                      OpKind)
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.timeline import MemorySample, Span, Timeline

from .collective_model import slows_compute
from .gc_pause import gc_paused
from .lane_turn import LaneTurn
from .network import Network
from .progress import CHECK_EVERY, Progress
from .run_ahead import RunAhead
from .span_info import SendInfo, WaitedInfo, received_from


@dataclass(frozen=True)
class MemoryModel:
    """Per-rank bytes: `static[r]` held all iteration; each forward of stage s adds
    `activations[s]` (on its first layer group), released when its last backward op (B,
    or W after I; the last group when chunked) ends. Optional `gathered(op)`: bytes a
    completed parameter ALL_GATHER holds (ZeRO-3 / FSDP unsharded parameters) until the
    last compute op that waits for it (schedules.contract.local_waits) ends."""

    static: Sequence[int]
    activations: Sequence[int]
    gathered: Callable[[Op], int] | None = None


_start, _rank = attrgetter("start"), attrgetter("rank")  # the Timeline's span order


def when_processed(pending: list[simpy.Event], then: Callable[[], None]) -> None:
    """Call `then()` once every event of `pending` (emptied, last first) is processed: now
    if all are, else from the callbacks of the first one still pending, in turn. A
    module function, so that no callback refers to itself: the CLI runs with the cyclic
    garbage collector off, and a closure that names itself would keep all it holds (a
    full replay's posts: a million) until the run ends."""
    while pending:
        event = pending.pop()
        if not event.processed:
            event.callbacks.append(lambda _event: when_processed(pending, then))
            return
    then()


def _wake_once(wake: simpy.Event, _timer: simpy.Event) -> None:
    """A slowed compute op's timer: wake it, unless a rate change already has."""
    if not wake.triggered:
        wake.succeed()


def _copy_after(network: Network, src: str, dst: str, nbytes: float, left: int,
                done: simpy.Event) -> None:
    """`left` more back-to-back transfers of `nbytes` from src to dst, then `done`."""
    if not left:
        done.succeed()
        return
    network.transfer(src, dst, nbytes).callbacks.append(
        lambda _event: _copy_after(network, src, dst, nbytes, left - 1, done))


def _mask(n: int, indices) -> bytes:
    """n bytes, 1 at `indices`, 0 elsewhere."""
    mask = bytearray(n)
    for index in indices:
        mask[index] = 1
    return bytes(mask)


@dataclass(frozen=True)
class ReplayRanks:
    """What each replayed rank is, when they are not simply the schedule's pipeline ranks
    (the full replay: sim.world). `programs[r]`: the pipeline rank whose program replay
    rank r runs; `replicas[r]`: its replica (keyed completions and P2P pair within one);
    `meet(r, op)`: the replay ranks (r included) that post collective `op` and run it once
    together; `speed[r]`: how many times longer r's compute ops take (1: as costed)."""

    programs: Sequence[int]
    replicas: Sequence[int]
    meet: Callable[[int, Op], tuple[int, ...]]
    speed: Sequence[float] | None = None


class Replay(RunAhead):
    """Replays `schedule` (lowered, with P2P ops) on `devices[r]` for pipeline rank r, or,
    with `ranks` (ReplayRanks), for replay rank r running program `ranks.programs[r]`."""

    def __init__(self, env: simpy.Environment, schedule: Schedule, devices: Sequence[str],
                 compute_time: Callable[[Op], float], network: Network,
                 memory: MemoryModel | None = None,
                 collective: Callable[[Op, int], simpy.Event] | None = None,
                 hosts: Sequence[str] | None = None,
                 slowdown: Sequence[float] | None = None,
                 ranks: ReplayRanks | None = None):
        self.env, self.schedule, self.devices = env, schedule, devices
        self.compute_time, self.network, self.memory = compute_time, network, memory
        self.collective, self.hosts = collective, hosts
        which = list(range(schedule.num_ranks)) if ranks is None else list(ranks.programs)
        self.programs = [schedule.programs[p] for p in which]
        n = len(which)
        self.replica = [0] * n if ranks is None else list(ranks.replicas)
        self.meet = None if ranks is None else ranks.meet
        self.speed = None if ranks is None or ranks.speed is None else list(ranks.speed)
        # overlap slowdown (module docstring): f per rank, the rank's running slowing
        # collectives, and the wake event of its slowed compute op (_slowed), succeeded
        # by its timer or when that count leaves or reaches 0, whichever comes first
        self.slowdown = [f if any(op.kind in COLLECTIVE_KINDS and slows_compute(op)
                                  for op in program) else 0.0
                         for f, program in zip(slowdown, self.programs)] \
            if slowdown is not None else [0.0] * n
        self.slowing = [0] * n
        self.slowed_wake: list[simpy.Event | None] = [None] * n
        self.last_on_lane: dict[tuple[int, str], LaneTurn] = {}
        replicas = max(self.replica) + 1
        self.done: list[set[Key]] = [set() for _ in range(replicas)]  # keys per replica
        self.waiting: list[dict[Key, simpy.Event]] = [{} for _ in range(replicas)]  # events
        # exist only for awaited keys
        self.posted: list[dict[Key, tuple[int, Op, float]]] = [{} for _ in range(replicas)]
        self.ready_copies: dict[tuple, tuple] = {}  # DualPipe's copy all-reduce, one side
        self.meetings: dict[tuple, list] = {}  # a collective's members posted so far
        self.meeting_ends: dict[tuple, simpy.Event] = {}  # its members' one end event
        self.lane_posts: dict[tuple[int, str], int] = {}  # collectives posted per lane
        self.spans: list[Span] = []
        self.samples: list[MemorySample] = []
        self.pc = [0] * n
        self.allocated = [0] * n
        self.split_backward = {(op.stage, op.microbatch)
                               for op in schedule.ops() if op.kind is OpKind.W}
        self.chains = schedule.stage_chains
        contracts = [program_contract(p, schedule.stage_ranks, self.chains)
                     for p in schedule.programs]
        self.contracts = [contracts[p] for p in which]
        # positional waits: which indices are awaited, which are done, events on demand
        awaited = [{j for waits in c.local for j in waits} for c in contracts]
        self.awaited = [awaited[p] for p in which]
        self.local_done: list[set[int]] = [set() for _ in range(n)]
        self.local_events: dict[tuple[int, int], simpy.Event] = {}
        releases = ([gather_releases(program, contract) for program, contract
                     in zip(schedule.programs, contracts)]
                    if memory and memory.gathered else None)
        self.releases = None if releases is None else [releases[p] for p in which]
        self.held = [{g for gs in r.values() for g in gs} for r in self.releases or ()]
        ends = [self._activation_ends(p) if memory else (b"", b"")
                for p in schedule.programs]
        self.activation_ends = [ends[p] for p in which]
        # each op's keys (awaited, made) listed once per program that several replay ranks
        # run (the full replay: 64 ranks a program), not found again per rank and op; a
        # program run once is not listed (a deep pipeline's millions of tuples)
        uses = Counter(which)
        listed = {p: (program_needs(program, contracts[p], schedule.stage_ranks,
                                    schedule.num_microbatches, self.chains),
                      program_products(program))
                  for p, program in enumerate(schedule.programs) if uses[p] > 1}
        self.listed = [listed.get(p) for p in which]
        self.handlers = self._dispatch_table()
        self._init_run_ahead(contracts, which)

    def _complete(self, rank: int, index: int, op: Op) -> None:
        listed = self.listed[rank]
        keys = (listed[1][index] if listed is not None
                else op_products(op, index, self.contracts[rank].completes))
        if keys:  # most collectives make no key
            self._satisfy(keys, self.replica[rank])
        if index in self.awaited[rank]:
            self.local_done[rank].add(index)
            ev = self.local_events.pop((rank, index), None)
            if ev is not None and not ev.triggered:  # a meeting's: its first member's
                ev.succeed()

    def _satisfy(self, keys: Sequence[Key], replica: int) -> None:
        """Mark `keys` done in `replica`, waking the ops that wait for them (in `keys`'
        order)."""
        done, waiting = self.done[replica], self.waiting[replica]
        for key in keys:
            done.add(key)
            if waiting:
                ev = waiting.pop(key, None)
                if ev is not None:
                    ev.succeed()

    def _local_event(self, rank: int, index: int) -> simpy.Event | None:
        """None when op `index` of `rank` is done, else the event of its completion."""
        if index in self.local_done[rank]:
            return None
        ev = self.local_events.get((rank, index))
        if ev is None:
            ev = self.local_events[(rank, index)] = self.env.event()
        return ev

    def _activation_ends(self, program: Sequence[Op]) -> tuple[bytes, bytes]:
        """Per op of `program`, 1 where it allocates (the first forward group of (s,m)),
        and 1 where it releases (the last backward group: B, or W after I) a microbatch's
        activations: a byte per op, not a set of indices (a deep pipeline has millions)."""
        first: dict[tuple, int] = {}
        last: dict[tuple, int] = {}
        f, b, i, w, split = OpKind.F, OpKind.B, OpKind.I, OpKind.W, self.split_backward
        for index, op in enumerate(program):
            kind = op.kind
            if kind is f:
                first.setdefault((op.stage, op.microbatch), index)
            elif kind is b or kind is w or (kind is i and (op.stage, op.microbatch) not in split):
                last[(op.stage, op.microbatch)] = index
        return _mask(len(program), first.values()), _mask(len(program), last.values())

    def _allocate(self, rank: int, nbytes: int, at: float | None = None) -> None:
        """`nbytes` more held by `rank` from `at` (default now) on."""
        if nbytes:
            self.allocated[rank] += nbytes
            self.samples.append(MemorySample(rank, self.env.now if at is None else at,
                                             self.allocated[rank]))

    def _run_rank(self, rank: int):
        env, contract = self.env, self.contracts[rank]
        ranks, count = self.schedule.stage_ranks, self.schedule.num_microbatches
        replica = self.replica[rank]
        chains, done, waiting = self.chains, self.done[replica], self.waiting[replica]
        handlers, local, pc = self.handlers, contract.local, self.pc
        slowdown, unfinished, program = self.slowdown, self.unfinished_slowing, self.programs[rank]
        needs, local_done = self.listed[rank] and self.listed[rank][0], self.local_done[rank]
        index, n, timeable = 0, len(program), self._timeable_of(rank)
        while index < n:
            if timeable[index] and timeable[index + 1]:  # sim.run_ahead: ops timed
                ahead = self._ahead(rank, index)  # without events
                if ahead is not None:
                    yield from self._run_ahead(rank, *ahead)
                    index += len(ahead[0])
                    continue
            op = program[index]
            kind = op.kind
            keys = needs[index] if needs else op_needs(op, index, contract, ranks, count, chains)
            for key in keys:
                if key not in done:
                    ev = waiting.get(key)
                    if ev is None:
                        ev = waiting[key] = env.event()
                    yield ev
            waits = local[index]
            local_events = [self._local_event(rank, j) for j in waits
                            if j not in local_done] if waits else ()
            work = kind in WORK_KINDS
            if local_events and (work or kind in P2P_KINDS):
                for ev in local_events:  # a compute op or a P2P post waits here, in the
                    yield ev  # program (the handlers' generators did, one frame deeper)
                local_events = ()
            if work and not local_events and not (
                    slowdown[rank] and unfinished[rank]):  # nothing can slow it: one timer
                start = env.now  # _compute without its generator: a deep pipeline's most
                yield env.timeout(self._compute_starts(rank, index, op))  # common op
                self._compute_ends(rank, index, op, start, None)
                pc[rank] += 1
                index += 1
                continue
            handler = handlers.get(kind)
            if handler is None:
                raise ConfigError(f"rank {rank}: op {op}: the replay cannot run "
                                  f"{kind.value} ops")
            steps = handler(rank, index, op, local_events)
            if steps is not None:  # the op holds this rank's program until it is done
                yield from steps
            pc[rank] += 1
            index += 1

    def _dispatch_table(self) -> dict[OpKind, Callable]:
        """Op kind -> its handler (rank, index, op, positional waits): a generator the
        rank's program runs through (compute on the stream, a P2P post after its waits),
        or None when the op was posted to run on a lane of its own."""
        table: dict[OpKind, Callable] = {kind: self._compute for kind in WORK_KINDS}
        table.update({kind: self._post_p2p for kind in P2P_KINDS})
        table.update({kind: self._start_async for kind in (*COLLECTIVE_KINDS, *COPY_KINDS)})
        table[OpKind.OPT_STEP] = self._optimizer_step
        return table

    def _compute(self, rank: int, index: int, op: Op, local: Sequence[simpy.Event]):
        """Hold the rank's one compute stream for the op's duration; memory moves with it."""
        env = self.env
        for ev in local:
            yield ev
        start = env.now
        seconds = self._compute_starts(rank, index, op)
        # slowed only while a slowing collective the rank posted runs: none posted and
        # unfinished, none can start before the op ends (the rank posts nothing meanwhile)
        factor = (self.slowdown[rank] if op.kind in WORK_KINDS and self.unfinished_slowing[rank]
                  else 0.0)
        if factor and seconds > 0:
            yield from self._slowed(rank, seconds, factor)
            extra = env.now - start - seconds
            info = {"overlap_slowdown_s": extra} if extra > 1e-9 * seconds else None
        else:
            yield env.timeout(seconds)
            info = None
        self._compute_ends(rank, index, op, start, info)

    def _compute_starts(self, rank: int, index: int, op: Op) -> float:
        """A compute op starts now: its activations are allocated; its seconds."""
        if self.memory and self.activation_ends[rank][0][index]:
            self._allocate(rank, self.memory.activations[op.stage])
        return self._compute_seconds(rank, op)

    def _compute_seconds(self, rank: int, op: Op) -> float:
        """The op's compute seconds on `rank`: as costed, times the rank's speed factor."""
        if self.speed is not None:
            return self.compute_time(op) * self.speed[rank]
        return self.compute_time(op)

    def _compute_ends(self, rank: int, index: int, op: Op, start: float,
                      info: Mapping | None) -> None:
        """A compute op ends now: its span, the memory it frees, the keys it satisfies."""
        self.spans.append(Span(rank, COMPUTE_LANE, op, start, self.env.now, info))
        if self.memory and self.activation_ends[rank][1][index]:
            self._allocate(rank, -self.memory.activations[op.stage])
        if self.releases is not None:
            for gather in self.releases[rank].get(index, ()):
                self._allocate(rank, -self._gathered(rank, gather))
        self._complete(rank, index, op)

    def _slowed(self, rank: int, seconds: float, factor: float):
        """Run `seconds` of compute work on `rank`'s stream at speed 1 / (1 + factor)
        while a slowing collective of the rank runs, 1 otherwise (module docstring)."""
        env, remaining = self.env, seconds
        while True:  # wake: at the timer, or at a rate change (_slowing) if that is first
            rate = 1.0 / (1.0 + factor) if self.slowing[rank] else 1.0
            wake = self.slowed_wake[rank] = env.event()
            begin = env.now
            timer = env.timeout(remaining / rate)
            timer.callbacks.append(partial(_wake_once, wake))
            yield wake
            if timer.processed:
                self.slowed_wake[rank] = None
                return
            remaining -= (env.now - begin) * rate
            if remaining <= 0:
                return

    def _slowing(self, rank: int, delta: int) -> None:
        """A slowing collective of `rank` starts (+1) or ends (-1)."""
        before = self.slowing[rank]
        self.slowing[rank] = before + delta
        if (before == 0) != (self.slowing[rank] == 0):
            wake, self.slowed_wake[rank] = self.slowed_wake[rank], None
            if wake is not None and not wake.triggered:  # triggered: its timer fired now,
                wake.succeed()  # the op ends now whatever the rate (_slowed)

    def _optimizer_step(self, rank: int, index: int, op: Op, local: Sequence[simpy.Event]):
        """On the compute stream, or (group 'host', ZeRO-Offload) on the host's lane."""
        if runs_on_compute_stream(op):
            return self._compute(rank, index, op, local)
        return self._start_async(rank, index, op, local)

    def _post_p2p(self, rank: int, index: int, op: Op, local: Sequence[simpy.Event]) -> None:
        """Post now: the program has waited for the op's positional waits (`_run_rank`: a
        SEND waits for its compute op's intra-layer collectives), so `local` is empty."""
        self._post(rank, index, op)

    def _gathered(self, rank: int, index: int) -> int:
        return self.memory.gathered(self.programs[rank][index])

    def _post(self, rank: int, index: int, op: Op) -> None:
        """Post a P2P op; once both ends are, the transfer starts (and both leave
        `posted`, which so holds only the ends waiting for their peer)."""
        now, posted = self.env.now, self.posted[self.replica[rank]]
        peer = posted.pop(p2p_peer(op), None)
        if peer is None:
            posted[op.key] = (rank, index, op, now)
            return
        peer_rank, peer_index, peer_op, _ = peer
        if op.kind in (OpKind.SEND_F, OpKind.SEND_B):
            (src, si, send), (dst, ri, recv) = (rank, index, op), (peer_rank, peer_index, peer_op)
        else:
            (src, si, send), (dst, ri, recv) = (peer_rank, peer_index, peer_op), (rank, index, op)
        done = self.network.transfer(self.devices[src], self.devices[dst], send.nbytes)
        done.callbacks.append(partial(self._delivered, src, si, send, dst, ri, recv, now))

    def _delivered(self, src: int, si: int, send: Op, dst: int, ri: int, recv: Op,
                   now: float, _event: simpy.Event) -> None:
        """A P2P transfer started at `now` has arrived: both ends' spans and completions."""
        end = self.env.now
        info = SendInfo(dst, send.nbytes / (end - now) if end > now else None)
        self.spans.append(Span(src, SEND_LANE, send, now, end, info))
        self.spans.append(Span(dst, RECV_LANE, recv, now, end, received_from(src)))
        self._complete(src, si, send)
        self._complete(dst, ri, recv)

    def _start_async(self, rank: int, index: int, op: Op, waits: Sequence[simpy.Event]) -> None:
        """Run a posted non-P2P op on its lane after the lane's previous op (issue order,
        as NCCL runs a communicator's operations) and its positional `waits`. A
        collective's other members are this program rank in the other replicas, which by
        symmetry post it at the same moment, or, in the full replay, replayed ranks it
        meets (module docstring)."""
        lane = self._lane(rank, op)
        slows = slows_compute(op)  # and every member's: they share its lane, so its group
        if slows and self.slowdown[rank]:  # no run-ahead until it ends
            self.unfinished_slowing[rank] += 1
        key = (rank, lane)
        previous = self.last_on_lane.get(key)
        turn = self.last_on_lane[key] = LaneTurn(self.env)
        meeting = None
        if self.meet is not None and op.kind in COLLECTIVE_KINDS and op.group != PP_COPIES:
            together = self.meet(rank, op)
            if len(together) > 1:  # the n-th collective each member posts on this lane
                seq = self.lane_posts.get(key, 0)
                self.lane_posts[key] = seq + 1
                meeting = (together, lane, seq)
                if index in self.awaited[rank]:  # its waiters wait on the meeting's one
                    ends = self.meeting_ends  # event, not one per member (_complete)
                    end = ends.get(meeting)
                    if end is None:
                        end = ends[meeting] = self.env.event()
                    self.local_events[(rank, index)] = end
        start = partial(self._start_posted, (rank, index, op, lane, turn), slows, meeting)
        if previous is not None and not previous.over:  # its waits, then the lane's
            start = partial(previous.then, start)  # previous op (which ends by then, mostly)
        pending = [ev for ev in waits if not ev.processed] if waits else None
        if pending:
            when_processed(pending, start)
        else:
            start()

    def _start_posted(self, member: tuple, slows: bool, meeting: tuple | None) -> None:
        """A posted op's waits are met and its lane is free: it starts now, or, when it
        meets others (DualPipe's copy all-reduce, a full replay's collective), once they
        are ready too. `member`: (rank, index, op, lane, its LaneTurn)."""
        rank, _, op, _, _ = member
        posts = None  # the full replay: when each member posted the collective
        if op.group == PP_COPIES:  # both replayed copies meet: one collective for both
            replica = self.replica[rank]
            partner = self.ready_copies.pop((replica, copy_peer(op, self.chains)), None)
            if partner is None:
                self.ready_copies[(replica, op.key)] = member
                return
            members = [member, partner]
        elif meeting is not None:  # the full replay: every member runs it once, together
            arrived = self.meetings.get(meeting)
            if arrived is None:
                arrived = self.meetings[meeting] = []
            arrived.append((member, self.env.now))
            if len(arrived) < len(meeting[0]):
                return
            del self.meetings[meeting]
            self.meeting_ends.pop(meeting, None)
            members = [m for m, _ in arrived]
            posts = {m[0]: at for m, at in arrived}
        else:
            members = [member]
        begin = self.env.now
        running = self._run_on_lane(rank, op)
        slowing = [r for r, *_ in members if self.slowdown[r]] if slows else ()
        for r in slowing:
            self._slowing(r, +1)
        running.callbacks.append(partial(self._end_posted, members, slowing, slows, posts,
                                         begin))

    def _end_posted(self, members: list[tuple], slowing: Sequence[int], slows: bool,
                    posts: dict[int, float] | None, begin: float, event: simpy.Event) -> None:
        """The op `_start_posted` started has ended: each member's span and completion, and
        its lane's next op may start."""
        for r in slowing:
            self._slowing(r, -1)
        info = shared = event.value if isinstance(event.value, dict) else None
        last = (max(posts, key=posts.get) if posts and
                max(posts.values()) > min(posts.values()) else None)
        now, spans, slowdown = self.env.now, self.spans, self.slowdown
        for r, i, member, on, member_turn in members:
            if slows and slowdown[r]:
                self.unfinished_slowing[r] -= 1
            if posts:  # who the members waited for (sim.waits)
                info = WaitedInfo(shared, begin - posts[r], last)
            spans.append(Span(r, on, member, begin, now, info))
            if self.releases is not None and i in self.held[r]:
                self._allocate(r, self._gathered(r, i))
            self._complete(r, i, member)
            member_turn.end()

    def _lane(self, rank: int, op: Op) -> str:
        """The lane a posted non-P2P op runs on (module docstring)."""
        kind = op.kind
        if kind in COLLECTIVE_KINDS:
            if self.collective is None:
                raise ConfigError(f"rank {rank}: op {op} is a collective, but this replay has "
                                  "no collective model")
            return collective_lane(op.group)
        if kind in COPY_KINDS:
            if self.hosts is None:
                raise ConfigError(f"rank {rank}: op {op} copies to or from the host, but this "
                                  "replay has no host CPU nodes (hosts=)")
            return PCIE_LANE
        return HOST_LANE  # a host OPT_STEP

    def _run_on_lane(self, rank: int, op: Op) -> simpy.Event:
        """Start `op` (posted by `rank`, `_lane`'s checks passed) now; the event of its end."""
        kind = op.kind
        if kind in COLLECTIVE_KINDS:
            return self.collective(op, rank)
        if kind in COPY_KINDS:
            gpu, host = self.devices[rank], self.hosts[rank]
            src, dst = (gpu, host) if kind is OpKind.COPY_D2H else (host, gpu)
            return self._copies(src, dst, op)
        return self.env.timeout(self.compute_time(op))

    def _copies(self, src: str, dst: str, op: Op) -> simpy.Event:
        """`op.count` back-to-back transfers of nbytes / count each (k copies pay k
        latencies, as a collective of count k pays k alphas)."""
        if op.count == 1:
            return self.network.transfer(src, dst, op.nbytes)
        done = self.env.event()
        _copy_after(self.network, src, dst, op.nbytes / op.count, op.count, done)
        return done

    def run(self) -> Timeline:
        return run_replays([self])[0]

    def start(self) -> None:
        """Hold the static memory and start every rank's process (run_replays runs them)."""
        if self.memory:
            for rank, nbytes in enumerate(self.memory.static):
                self._allocate(rank, nbytes)
        for rank in range(len(self.programs)):
            self.env.process(self._run_rank(rank))

    def finish(self) -> Timeline:
        """The Timeline, once the environment has no event left (DeadlockError if a rank
        is stuck)."""
        self._raise_if_stuck()
        self._forget()
        # by (start, rank), as two stable sorts on one attribute: no key tuple per span
        self.spans.sort(key=_rank)
        self.spans.sort(key=_start)
        return Timeline(self.spans, self.samples, source="sim")

    def _forget(self) -> None:
        """Drop the replay's bookkeeping once it has ended (keys done, posts, events: one
        entry per op of a deep pipeline) and the dispatch table, whose bound methods hold
        the replay in a reference cycle, so all of it is freed now rather than at the
        next garbage collection."""
        self.done, self.waiting, self.posted, self.local_events = [], [], [], {}
        self.local_done = [set() for _ in self.local_done]
        self.last_on_lane, self.ready_copies, self.handlers = {}, {}, {}
        self.meetings, self.lane_posts, self.meeting_ends = {}, {}, {}

    def _raise_if_stuck(self) -> None:
        programs = self.programs
        stuck = {r: programs[r][pc] for r, pc in enumerate(self.pc) if pc < len(programs[r])}
        if not stuck:
            return
        lines = []
        for rank, op in stuck.items():
            missing = [k for k in prerequisites(op, self.schedule.stage_ranks,
                                                self.schedule.num_microbatches, self.chains)
                       if k not in self.done[self.replica[rank]]]
            waits = ", ".join(f"{k[1]}{k[0].value}{'' if k[2] is None else k[2]}"
                              for k in missing)
            lines.append(f"rank {rank} stuck at {op} (step {self.pc[rank]}) waiting for {waits}")
        report = "\n".join(
            f"rank {r}: " + " ".join(
                f">{op}<" if i == self.pc[r] else str(op) for i, op in enumerate(p)
            ) for r, p in enumerate(programs)
        )
        raise DeadlockError("deadlock in simulation: " + "; ".join(lines), stuck, report)


def run_replays(replays: Sequence[Replay]) -> list[Timeline]:
    """Run replays that share one environment (and network: several jobs on one fabric,
    sim.shared_fabric) to its end, each to its own Timeline, in order."""
    env = replays[0].env
    if any(replay.env is not env for replay in replays):
        raise ValueError("run_replays: the replays must share one environment")
    for replay in replays:
        replay.start()
    progress = Progress(sum(len(p) for replay in replays for p in replay.programs))
    step = env.step
    with gc_paused():
        try:
            while True:  # simpy's Environment.run, with a look at the progress
                for _ in range(CHECK_EVERY):
                    step()
                progress.tick(sum(sum(replay.pc) for replay in replays))
        except EmptySchedule:
            pass
        finally:
            progress.close()
        return [replay.finish() for replay in replays]
