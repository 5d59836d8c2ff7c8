"""Serving replicas on the SimPy engine: requests arrive, a replica's scheduler forms
each step's batch, the step takes step_cost's time, tokens come out. Units: seconds.

`dp` replicas, each `pp` pipeline stages of a tensor-parallel group, with its own KV block
pool; arriving requests go to the replicas in turn (round robin in arrival order). With
pp > 1 a replica runs pp schedulers over its queue and pool (vLLM's virtual engines), so
that pp batches are in flight: a batch's step runs stage after stage, each stage one
batch at a time in arrival order, the activations (new tokens x h) sent from each stage's
first GPU to the next's between them (`p2p`); its tokens come out after the last stage.
Policies (each scheduler's):
- 'continuous' (iteration-level batching, Orca / vLLM's V0 scheduler): before every
  step, waiting requests are admitted first come first served while the running
  sequences stay within `max_num_seqs`, the step's new tokens within
  `max_num_batched_tokens` and their prompt's blocks are free; a step with admitted
  prompts runs only their prefills (each samples its first token), otherwise one decode
  step runs every running sequence. A decoding sequence that needs a block when none is
  free preempts the most recently admitted one (vLLM's recompute preemption: its blocks
  are freed and it waits again, at the head of the queue, to prefill its prompt and the
  tokens it had made). With `Swap` (vLLM V0's --preemption-mode swap) a preempted
  sequence's blocks are copied to the host's swap space instead, while it has room, and
  copied back before any new prompt is admitted, as soon as its blocks are free, to
  decode on without a prefill; each copy takes its blocks x Swap.seconds_per_block (every
  GPU over its own PCIe link, in parallel) and is charged to the replica's next step.
- 'chunked-prefill' (Sarathi-Serve; vLLM's V1 scheduler): every step spends a budget of
  `max_num_batched_tokens` new tokens, first one per decoding sequence, then on the
  prompts in admission order, a prompt longer than what is left fed in chunks over
  several steps (it samples its first token in the step that feeds its last chunk);
  waiting requests are admitted with what budget and seats are left. Blocks grow with the
  tokens cached; when none is free the newest sequence not yet in the step is preempted
  (recompute), as above.
- 'static': requests are served `batch_size` at a time, in arrival order: the batch
  starts when its last request has arrived, prefills together, then decodes until its
  longest output is done (finished sequences still occupy their slot: padding); the next
  batch starts after it.
- 'disaggregated' (DistServe, Splitwise; vLLM's disaggregated prefill): the first
  `prefill_replicas` replicas only prefill (admitted as under 'continuous', requests sent
  to them in turn), each prompt's KV cache then moves to a decode replica (in turn),
  taking `kv_transfer` seconds (each transfer alone on the network: contention between
  transfers is not modelled) while its prefill blocks stay held; a decode replica admits
  a sequence when blocks for its whole output are free (reserved up front: no preemption)
  and runs decode steps only.
With expert parallelism (StepCost.ep > 1: ep / tp replicas per group, pp = 1) the replicas
of a group step together, as vLLM's data-parallel ranks with expert parallelism do (an idle one
runs a dummy batch): a step starts when a replica of the group has a batch, every replica
with a batch at that instant joins it (one arriving later waits for the next), and it
lasts the slowest member's own step plus the group's routed experts
(StepCost.expert_parallel_parts): each MoE layer's all-to-all waits for every member.
Every request's token times are recorded (`Served`); `kv_usage` samples the fraction of
the replica's blocks in use after every step, `in_system` the number of requests in the
system after every arrival and completion (for Little's law).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

from clustersim.schedules.errors import ConfigError

from .kv_cache import BlockPool, blocks_for
from .step_cost import StepCost
from .workload import Request

POLICIES = ("continuous", "chunked-prefill", "static", "disaggregated")


@dataclass(eq=False)  # identity: a request is itself, whatever its tokens so far
class Served:
    """One request's life: its token times (s); `replica` that served it."""

    request: Request
    replica: int = -1
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0

    @property
    def done(self) -> bool:
        return len(self.token_times) >= self.request.output_tokens


@dataclass(eq=False)  # identity (`in` and `remove` on the running list)
class _Sequence:
    served: Served
    blocks: int = 0
    cached: int = 0  # tokens in its KV cache (chunked prefill's progress)

    @property
    def tokens(self) -> int:  # prompt + tokens made so far (what its KV cache holds)
        return self.served.request.input_tokens + len(self.served.token_times)


@dataclass(frozen=True)
class Step:
    """One engine step of one pipeline stage of a replica: when, its prompt tokens and
    decoding sequences, and how many of its seconds were communication (TP and SP
    collectives, EP all-to-alls, swap copies)."""

    start: float
    end: float
    prompt_tokens: int
    decodes: int
    communication: float
    stage: int = 0


@dataclass
class ServingRun:
    """What a run produced: every request's record, the KV usage samples per replica
    [(time, fraction of blocks in use)], the in-system samples [(time, count)], the
    total blocks per replica, each replica's steps, and the KV blocks swap preemption
    copied either way."""

    served: list[Served]
    kv_usage: list[list[tuple[float, float]]]
    in_system: list[tuple[float, int]]
    blocks: int
    step_log: list[list[Step]]
    swapped_blocks: int = 0  # blocks copied to or from the host (swap preemption)

    @property
    def steps(self) -> list[int]:
        """Steps (batches through every stage) each replica ran."""
        return [sum(1 for step in log if step.stage == 0) for log in self.step_log]


@dataclass(frozen=True)
class Swap:
    """Swap preemption's host space per GPU, in KV blocks, and the seconds one block's
    copy takes either way."""

    blocks: int
    seconds_per_block: float


@dataclass(frozen=True)
class Limits:
    """The scheduler's limits (vLLM's flags): sequences per step, new tokens per step, and
    the static batch size."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    batch_size: int | None = None


class _ExpertGroup:
    """The replicas of one expert-parallel group stepping together (module docstring):
    `submit` a replica's batch, get an event whose value is the step's (start, end,
    communication seconds of that replica)."""

    def __init__(self, env: simpy.Environment, cost: StepCost):
        self.env, self.cost = env, cost
        self.pending: list = []  # [(batch, copy seconds, event)] for the next step
        self.wakeup = None
        env.process(self._steps())

    def submit(self, batch, copies: float = 0.0) -> simpy.Event:
        """`copies`: the replica's swap seconds, added to its own part of the step."""
        done = self.env.event()
        self.pending.append((batch, copies, done))
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()
        return done

    def _steps(self):
        env = self.env
        while True:
            if not self.pending:
                self.wakeup = env.event()
                yield self.wakeup
            yield env.timeout(0)  # the members submitting at this instant join
            members, self.pending = self.pending, []
            parts = []  # each member's (compute, communication and swap copies)
            for batch, copies, _ in members:
                compute, communication = self.cost.parts(batch)
                parts.append((compute, communication + copies))
            experts, exchange = self.cost.expert_parallel_parts(
                [sum(q for q, _ in batch) for batch, _, _ in members])
            start = env.now
            yield env.timeout(max(map(sum, parts)) + experts + exchange)
            for (_, _, done), (_, communication) in zip(members, parts):
                done.succeed((start, env.now, communication + exchange))


class _Replica:
    """One replica's shared state: its queue, block pool, stages (a resource each) and
    schedulers' count of finished requests; `wait` / `wake` for arrivals; the expert-
    parallel `group` it steps with (None without EP)."""

    def __init__(self, env, index: int, total: int, costs: Sequence[StepCost],
                 blocks: int, limits: Limits, run: ServingRun, note,
                 p2p: Callable[[int, float], float] | None,
                 group: _ExpertGroup | None = None, swap: Swap | None = None):
        self.env, self.index, self.total, self.costs = env, index, total, costs
        self.queue: deque = deque()
        self.pool, self.limits, self.run, self.note, self.p2p = (BlockPool(blocks), limits,
                                                                 run, note, p2p)
        self.stages = [simpy.Resource(env, capacity=1) for _ in costs]
        self.finished = self.taken = 0  # taken: requests static batches took
        self.group = group
        self.swap, self.swapped = swap, deque()  # swapped: sequences in host memory
        self.swap_free = swap.blocks if swap else 0
        self.copy_seconds = 0.0  # swap copies to charge to the next step
        self._waiters: list = []

    def wait(self):
        event = self.env.event()
        self._waiters.append(event)
        return event

    def wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for event in waiters:
            event.succeed()

    def step(self, batch):
        """Run `batch` = [(new tokens, cached tokens)] through every stage (a generator)."""
        env, tokens = self.env, sum(q for q, _ in batch)
        decodes = StepCost.split(batch)[0]
        copies, self.copy_seconds = self.copy_seconds, 0.0
        if self.group is not None:  # one stage, stepping with its expert-parallel group
            start, end, communication = yield self.group.submit(batch, copies)
            self.run.step_log[self.index].append(Step(start, end, tokens - decodes, decodes,
                                                      communication))
            self.run.kv_usage[self.index].append((env.now, self.pool.used_fraction))
            return
        for stage, (cost, resource) in enumerate(zip(self.costs, self.stages)):
            with resource.request() as turn:
                yield turn
                compute, communication = cost.parts(batch)
                communication += copies if stage == 0 else 0.0
                start = env.now
                yield env.timeout(compute + communication)
            self.run.step_log[self.index].append(Step(start, env.now, tokens - decodes,
                                                      decodes, communication, stage))
            if stage < len(self.costs) - 1:
                yield env.timeout(self.p2p(stage, tokens))
        self.run.kv_usage[self.index].append((env.now, self.pool.used_fraction))

    def hand_off(self, seq, to: _Replica, transfer: float):
        """Move `seq`'s KV cache to replica `to` (a generator: `transfer` seconds), then
        free its blocks here and queue it there."""
        yield self.env.timeout(transfer)
        self.pool.give(seq.blocks)
        seq.blocks = 0
        self.finished += 1
        self.wake()
        to.queue.append(seq)
        to.wake()

    def done(self, seq) -> None:
        """`seq` made its last token: free its blocks, count it, wake idle schedulers."""
        self.pool.give(seq.blocks)
        self.finished += 1
        self.note(-1)
        self.wake()


def serve(requests: Sequence[Request], costs: Sequence[StepCost], blocks: int, dp: int = 1,
          policy: str = "continuous", limits: Limits = Limits(),
          p2p: Callable[[int, float], float] | None = None, prefill_replicas: int = 0,
          kv_transfer: Callable[[int, int, int], float] | None = None,
          swap: Swap | None = None) -> ServingRun:
    """Run `requests` through `dp` replicas of `len(costs)` pipeline stages (the cost of
    each stage's share of a step) and `blocks` KV blocks each (module docstring); `p2p`:
    (stage, new tokens) -> seconds to send a step's activations to the next stage;
    disaggregated: `prefill_replicas` of the dp prefill, `kv_transfer`: (from replica, to
    replica, cached tokens) -> seconds to move a sequence's KV cache. With expert
    parallelism (costs[0].ep > 1) groups of ep / tp consecutive replicas step together.
    `swap`: swap preemption (continuous batching only), else recompute."""
    if swap is not None and policy != "continuous":
        raise ConfigError(f"swap preemption is vLLM V0's continuous scheduler's; {policy} "
                          f"batching preempts by recompute or not at all")
    if policy not in POLICIES:
        raise ConfigError(f"batching must be one of {', '.join(POLICIES)}, got {policy!r}")
    if len(costs) > 1 and p2p is None:
        raise ValueError("pipeline stages need a p2p time")
    disaggregated = policy == "disaggregated"
    if disaggregated and not (1 <= prefill_replicas < dp and kv_transfer is not None):
        raise ConfigError(f"disaggregated serving needs 1 <= prefill replicas < dp = {dp} "
                          f"(the rest decode), got {prefill_replicas}")
    expert_parallel = costs[0].ep > 1
    ep_group = costs[0].ep // costs[0].tp if expert_parallel else 1
    if expert_parallel and (len(costs) > 1 or disaggregated or dp % ep_group):
        raise ConfigError(f"expert-parallel groups of {ep_group} replicas need one pipeline "
                          f"stage, a dp = {dp} they divide, and no disaggregation")
    _check(requests, blocks, policy, limits)
    env = simpy.Environment()
    served = [Served(r) for r in requests]
    run = ServingRun(served, [[] for _ in range(dp)], [], blocks, [[] for _ in range(dp)])
    live = [0]

    def note(change: int) -> None:
        live[0] += change
        run.in_system.append((env.now, live[0]))

    entry = prefill_replicas if disaggregated else dp  # the replicas requests arrive at
    home = [r.index % entry for r in requests]
    if disaggregated:  # decode replicas take the prompts with more than one output token
        decoding = dp - prefill_replicas
        home += [prefill_replicas + r.index % decoding for r in requests
                 if r.output_tokens > 1]
    groups = [_ExpertGroup(env, costs[0]) if expert_parallel else None
              for _ in range(dp // ep_group)]
    replicas = [_Replica(env, i, home.count(i), costs, blocks, limits, run, note, p2p,
                         groups[i // ep_group], swap) for i in range(dp)]

    def arrivals():  # every request of one instant is queued before a replica wakes
        upcoming = 0
        while upcoming < len(served):
            yield env.timeout(max(0.0, served[upcoming].request.arrival - env.now))
            woken: dict[int, _Replica] = {}
            while (upcoming < len(served)
                   and served[upcoming].request.arrival <= env.now):
                record = served[upcoming]
                replica = replicas[record.request.index % entry]
                record.replica = replica.index
                replica.queue.append(record)
                note(+1)
                woken[replica.index] = replica
                upcoming += 1
            for replica in woken.values():
                replica.wake()

    loops = {"continuous": _continuous, "chunked-prefill": _chunked, "static": _static}
    for replica in replicas:
        if disaggregated:
            if replica.index < prefill_replicas:
                loop = _prefill_only(replicas, prefill_replicas, kv_transfer)
            else:
                loop = _decode_only
        else:
            loop = loops[policy]
        for _ in costs:  # one scheduler per stage: as many batches in flight
            env.process(loop(replica))
    env.process(arrivals())
    env.run()
    return run


def _check(requests: Sequence[Request], blocks: int, policy: str, limits: Limits) -> None:
    """Refuse a workload the replica can never serve (cheap, before running)."""
    if not requests:
        raise ConfigError("no requests to serve")
    longest = max(r.input_tokens + r.output_tokens for r in requests)
    if policy == "static":
        size = min(limits.batch_size or 1, len(requests))  # the largest batch formed
        need = size * blocks_for(longest)
        if need > blocks:
            raise ConfigError(f"a static batch of {size} requests up to {longest} tokens "
                              f"needs {need} KV blocks; the replica has {blocks}: lower "
                              f"--batch-size")
        return
    if policy in ("continuous", "disaggregated"):  # a prompt is prefilled in one step
        prompt = max(r.input_tokens + r.output_tokens - 1 for r in requests)
        if policy == "disaggregated":  # prompts are prefilled once: no recompute
            prompt = max(r.input_tokens for r in requests)
        if prompt > limits.max_num_batched_tokens:
            raise ConfigError(
                f"a request of {longest} tokens (prompt and output) can need a prefill of "
                f"{prompt} tokens, above --max-num-batched-tokens "
                f"{limits.max_num_batched_tokens}: raise it, or use chunked-prefill batching")
    if blocks_for(longest) > blocks:
        raise ConfigError(f"a request of {longest} tokens needs {blocks_for(longest)} KV "
                          f"blocks; the replica has {blocks}")


def _head(r: _Replica) -> _Sequence:
    """The first waiting sequence (a request not yet begun, or one preempted), not taken."""
    head = r.queue[0]
    return head if isinstance(head, _Sequence) else _Sequence(head)


def _sample(r: _Replica, seq: _Sequence, running: list[_Sequence] | None = None) -> bool:
    """`seq` makes a token now; after its last it leaves `running` (where given) and the
    replica (its blocks freed). True when it is done."""
    seq.served.token_times.append(r.env.now)
    if not seq.served.done:
        return False
    if running is not None:
        running.remove(seq)
    r.done(seq)
    return True


def _admit_prompts(r: _Replica, seats: int) -> list[_Sequence]:
    """Waiting sequences taken first come first served for a prefill step: at most
    `seats`, their tokens within the step's budget, their blocks free (taken now)."""
    admitted, budget = [], r.limits.max_num_batched_tokens
    while r.queue and len(admitted) < seats:
        seq = _head(r)
        need = blocks_for(seq.tokens)
        if seq.tokens > budget or not r.pool.take(need):
            break
        r.queue.popleft()
        seq.blocks, budget = need, budget - seq.tokens
        admitted.append(seq)
    return admitted


def _swap_in(r: _Replica, running: list[_Sequence]) -> None:
    """Swapped sequences back to the GPU, first out first in, while their blocks are free
    and seats are left."""
    while r.swapped and len(running) < r.limits.max_num_seqs \
            and r.pool.take(r.swapped[0].blocks):
        seq = r.swapped.popleft()
        r.swap_free += seq.blocks
        _copy(r, seq.blocks)
        running.append(seq)


def _copy(r: _Replica, blocks: int) -> None:
    r.copy_seconds += blocks * r.swap.seconds_per_block
    r.run.swapped_blocks += blocks


def _continuous(r: _Replica):
    running: list[_Sequence] = []
    pool = r.pool
    while r.finished < r.total:
        _swap_in(r, running)
        seats = 0 if r.swapped else r.limits.max_num_seqs - len(running)
        admitted = _admit_prompts(r, seats)
        if admitted:
            yield from r.step([(s.tokens, 0) for s in admitted])
            running += admitted
            active = admitted
        elif running:
            for seq in list(running):  # a block for every sequence's next token
                while seq in running and blocks_for(seq.tokens) > seq.blocks:
                    if pool.take(1):
                        seq.blocks += 1
                        continue
                    _preempt(running[-1], running, r)  # the most recently admitted
            if not running:
                continue
            yield from r.step([(1, s.tokens - 1) for s in running])  # the last token in
            active = running
        else:
            yield r.wait()
            continue
        for seq in list(active):
            _sample(r, seq, running)


def _prefill_only(replicas: list[_Replica], prefill_replicas: int,
                  kv_transfer: Callable[[int, int, int], float]):
    """A prefill replica's scheduler (disaggregated): prompts as under 'continuous', each
    then handed to a decode replica, in turn."""
    decoding = len(replicas) - prefill_replicas

    def loop(r: _Replica):
        while r.finished < r.total:
            admitted = _admit_prompts(r, r.limits.max_num_seqs)
            if not admitted:
                yield r.wait()
                continue
            yield from r.step([(s.tokens, 0) for s in admitted])
            for seq in admitted:
                if _sample(r, seq):
                    continue
                to = replicas[prefill_replicas + seq.served.request.index % decoding]
                transfer = kv_transfer(r.index, to.index, seq.tokens - 1)
                r.env.process(r.hand_off(seq, to, transfer))
    return loop


def _decode_only(r: _Replica):
    """A decode replica's scheduler (disaggregated): sequences whose KV cache arrived are
    admitted when blocks for their whole output are free, then decode together."""
    running: list[_Sequence] = []
    queue, pool, limits = r.queue, r.pool, r.limits
    while r.finished < r.total:
        while queue and len(running) < limits.max_num_seqs:
            request = queue[0].served.request
            need = blocks_for(request.input_tokens + request.output_tokens)
            if not pool.take(need):
                break
            seq = queue.popleft()
            seq.blocks = need
            running.append(seq)
        if not running:
            yield r.wait()
            continue
        yield from r.step([(1, s.tokens - 1) for s in running])
        for seq in list(running):
            _sample(r, seq, running)


def _grow(pool: BlockPool, seq: _Sequence, tokens: int) -> bool:
    """Blocks for `tokens` more cached tokens of `seq` (True), or none taken (False)."""
    need = blocks_for(seq.cached + tokens) - seq.blocks
    if need <= 0 or pool.take(need):
        seq.blocks += max(0, need)
        return True
    return False


def _preempt(seq: _Sequence, running: list, r: _Replica) -> None:
    """Free `seq`'s blocks: swap them to the host when swapping and there is room, else
    recompute preemption (queue it first again, to prefill anew)."""
    running.remove(seq)
    r.pool.give(seq.blocks)
    seq.served.preemptions += 1
    if r.swap is not None and seq.blocks <= r.swap_free:
        r.swap_free -= seq.blocks
        _copy(r, seq.blocks)
        r.swapped.append(seq)
        return
    seq.blocks = seq.cached = 0
    r.queue.appendleft(seq)
    r.wake()


def _chunked(r: _Replica):
    running: list[_Sequence] = []  # in admission order
    queue, pool, limits = r.queue, r.pool, r.limits
    while r.finished < r.total:
        budget, batch = limits.max_num_batched_tokens, []  # batch: [(seq, new tokens)]
        for seq in sorted(running, key=lambda s: s.tokens - s.cached > 1):  # decodes first
            if budget == 0:
                break
            q = min(seq.tokens - seq.cached, budget)
            while seq in running and not _grow(pool, seq, q):
                stepping = {id(s) for s, _ in batch}
                _preempt(next(s for s in reversed(running) if id(s) not in stepping),
                         running, r)
            if seq in running:
                batch.append((seq, q))
                budget -= q
        while queue and budget > 0 and len(running) < limits.max_num_seqs:
            seq = _head(r)
            q = min(seq.tokens, budget)
            if not _grow(pool, seq, q):
                break
            queue.popleft()
            running.append(seq)
            batch.append((seq, q))
            budget -= q
        if not batch:
            yield r.wait()
            continue
        yield from r.step([(q, s.cached) for s, q in batch])
        for seq, q in batch:
            seq.cached += q
            if seq.cached == seq.tokens:  # not a prompt's chunk short of its end
                _sample(r, seq, running)


def _static(r: _Replica):
    size = r.limits.batch_size or 1
    while r.taken < r.total:
        want = min(size, r.total - r.taken)
        while len(r.queue) < want:
            yield r.wait()
            want = min(size, r.total - r.taken)
        if want == 0:
            return
        batch = [_Sequence(r.queue.popleft()) for _ in range(want)]
        r.taken += want
        for seq in batch:
            seq.blocks = blocks_for(seq.served.request.input_tokens
                                    + seq.served.request.output_tokens)
            if not r.pool.take(seq.blocks):
                raise AssertionError("static batches checked to fit")
        yield from r.step([(s.tokens, 0) for s in batch])
        _emit(r, batch)
        for _ in range(max(s.served.request.output_tokens for s in batch) - 1):
            yield from r.step([(1, s.tokens - 1) for s in batch])
            _emit(r, [s for s in batch if not s.served.done])
        for seq in batch:  # finished sequences held their blocks (padding) until now
            r.pool.give(seq.blocks)
        r.wake()


def _emit(r: _Replica, batch: list[_Sequence]) -> None:
    """Each sequence of `batch` makes a token now; those done leave the system."""
    for seq in batch:
        seq.served.token_times.append(r.env.now)
        if seq.served.done:
            r.finished += 1
            r.note(-1)


def duration(run: ServingRun) -> float:
    """Seconds from the first arrival to the last token."""
    first = min(s.request.arrival for s in run.served)
    return max(s.token_times[-1] for s in run.served) - first if run.served else math.nan
