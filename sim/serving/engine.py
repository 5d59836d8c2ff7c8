"""Serving replicas on the SimPy engine: requests arrive, a replica's scheduler forms
each step's batch, the step takes step_cost's time, tokens come out. Units: seconds.

`dp` replicas, each a tensor-parallel group with its own KV block pool; arriving
requests go to the replicas in turn (round robin in arrival order). Policies:
- 'continuous' (iteration-level batching, Orca / vLLM's V0 scheduler): before every
  step, waiting requests are admitted first come first served while the running
  sequences stay within `max_num_seqs`, the step's new tokens within
  `max_num_batched_tokens` and their prompt's blocks are free; a step with admitted
  prompts runs only their prefills (each samples its first token), otherwise one decode
  step runs every running sequence. A decoding sequence that needs a block when none is
  free preempts the most recently admitted one (vLLM's recompute preemption: its blocks
  are freed and it waits again, at the head of the queue, to prefill its prompt and the
  tokens it had made).
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
Every request's token times are recorded (`Served`); `kv_usage` samples the fraction of
the replica's blocks in use after every step, `in_system` the number of requests in the
system after every arrival and completion (for Little's law).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import simpy

from clustersim.schedules.errors import ConfigError

from .kv_cache import BlockPool, blocks_for
from .step_cost import StepCost
from .workload import Request

POLICIES = ("continuous", "chunked-prefill", "static")


@dataclass
class Served:
    """One request's life: its token times (s); `replica` that served it."""

    request: Request
    replica: int = -1
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0

    @property
    def done(self) -> bool:
        return len(self.token_times) >= self.request.output_tokens


@dataclass
class _Sequence:
    served: Served
    blocks: int = 0
    cached: int = 0  # tokens in its KV cache (chunked prefill's progress)

    @property
    def tokens(self) -> int:  # prompt + tokens made so far (what its KV cache holds)
        return self.served.request.input_tokens + len(self.served.token_times)


@dataclass(frozen=True)
class Step:
    """One engine step of a replica: when, its prompt tokens and decoding sequences, and
    how many of its seconds were TP communication."""

    start: float
    end: float
    prompt_tokens: int
    decodes: int
    communication: float


@dataclass
class ServingRun:
    """What a run produced: every request's record, the KV usage samples per replica
    [(time, fraction of blocks in use)], the in-system samples [(time, count)], the
    total blocks per replica, and each replica's steps."""

    served: list[Served]
    kv_usage: list[list[tuple[float, float]]]
    in_system: list[tuple[float, int]]
    blocks: int
    step_log: list[list[Step]]

    @property
    def steps(self) -> list[int]:
        """Steps each replica ran."""
        return [len(log) for log in self.step_log]


@dataclass(frozen=True)
class Limits:
    """The scheduler's limits (vLLM's flags): sequences per step, new tokens per step, and
    the static batch size."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    batch_size: int | None = None


def serve(requests: Sequence[Request], cost: StepCost, blocks: int, dp: int = 1,
          policy: str = "continuous", limits: Limits = Limits()) -> ServingRun:
    """Run `requests` through `dp` replicas of `blocks` KV blocks each (module docstring)."""
    if policy not in POLICIES:
        raise ConfigError(f"batching must be one of {', '.join(POLICIES)}, got {policy!r}")
    _check(requests, blocks, policy, limits)
    env = simpy.Environment()
    served = [Served(r) for r in requests]
    run = ServingRun(served, [[] for _ in range(dp)], [], blocks, [[] for _ in range(dp)])
    queues = [deque() for _ in range(dp)]
    wakeups = [env.event() for _ in range(dp)]
    live = [0]

    def note(change: int) -> None:
        live[0] += change
        run.in_system.append((env.now, live[0]))

    def arrivals():
        for record in served:
            yield env.timeout(max(0.0, record.request.arrival - env.now))
            replica = record.request.index % dp
            record.replica = replica
            queues[replica].append(record)
            note(+1)
            if not wakeups[replica].triggered:
                wakeups[replica].succeed()

    loop = {"continuous": _continuous, "chunked-prefill": _chunked, "static": _static}[policy]
    for replica in range(dp):
        total = sum(1 for r in served if r.request.index % dp == replica)
        env.process(loop(env, replica, total, queues[replica], wakeups, cost,
                         BlockPool(blocks), limits, run, note))
    env.process(arrivals())
    env.run()
    return run


def _check(requests: Sequence[Request], blocks: int, policy: str, limits: Limits) -> None:
    """Refuse a workload the replica can never serve (cheap, before running)."""
    if not requests:
        raise ConfigError("no requests to serve")
    longest = max(r.input_tokens + r.output_tokens for r in requests)
    if policy == "chunked-prefill":
        if blocks_for(longest) > blocks:
            raise ConfigError(f"a request of {longest} tokens needs {blocks_for(longest)} KV "
                              f"blocks; the replica has {blocks}")
    elif policy == "continuous":
        prompt = max(r.input_tokens + r.output_tokens - 1 for r in requests)
        if prompt > limits.max_num_batched_tokens:
            raise ConfigError(
                f"a request of {longest} tokens (prompt and output) can need a prefill of "
                f"{prompt} tokens, above --max-num-batched-tokens "
                f"{limits.max_num_batched_tokens}: raise it, or use chunked-prefill batching")
        if blocks_for(longest) > blocks:
            raise ConfigError(f"a request of {longest} tokens needs {blocks_for(longest)} KV "
                              f"blocks; the replica has {blocks}")
    else:
        size = limits.batch_size or 1
        need = size * blocks_for(longest)
        if need > blocks:
            raise ConfigError(f"--batch-size {size} of requests up to {longest} tokens needs "
                              f"{need} KV blocks; the replica has {blocks}")


def _step(env, cost: StepCost, batch, run: ServingRun, replica: int, pool: BlockPool):
    compute, communication = cost.parts(batch)
    start = env.now
    yield env.timeout(compute + communication)
    decodes = sum(1 for q, c in batch if q == 1 and c > 0)  # one token after a cache
    run.step_log[replica].append(Step(start, env.now, sum(q for q, _ in batch) - decodes,
                                      decodes, communication))
    run.kv_usage[replica].append((env.now, pool.used_fraction))


def _continuous(env, replica, total, queue, wakeups, cost, pool, limits, run, note):
    running: list[_Sequence] = []
    finished = 0
    while finished < total:
        admitted, budget = [], limits.max_num_batched_tokens
        while queue and len(running) + len(admitted) < limits.max_num_seqs:
            seq = queue[0] if isinstance(queue[0], _Sequence) else _Sequence(queue[0])
            need = blocks_for(seq.tokens)
            if seq.tokens > budget or not pool.take(need):
                break
            queue.popleft()
            seq.blocks, budget = need, budget - seq.tokens
            admitted.append(seq)
        if admitted:
            batch = [(s.tokens, 0) for s in admitted]
            yield from _step(env, cost, batch, run, replica, pool)
            running += admitted
            active = admitted
        elif running:
            for seq in list(running):  # a block for every sequence's next token
                while seq in running and blocks_for(seq.tokens) > seq.blocks:
                    if pool.take(1):
                        seq.blocks += 1
                        continue
                    victim = running.pop()  # the most recently admitted
                    pool.give(victim.blocks)
                    victim.blocks = 0
                    victim.served.preemptions += 1
                    queue.appendleft(victim)
            if not running:
                continue
            batch = [(1, s.tokens - 1) for s in running]  # the last token goes in
            yield from _step(env, cost, batch, run, replica, pool)
            active = running
        else:
            wakeups[replica] = env.event()
            yield wakeups[replica]
            continue
        for seq in list(active):
            seq.served.token_times.append(env.now)
            if seq.served.done:
                running.remove(seq)
                pool.give(seq.blocks)
                finished += 1
                note(-1)


def _grow(pool: BlockPool, seq: _Sequence, tokens: int) -> bool:
    """Blocks for `tokens` more cached tokens of `seq` (True), or none taken (False)."""
    need = blocks_for(seq.cached + tokens) - seq.blocks
    if need <= 0 or pool.take(need):
        seq.blocks += max(0, need)
        return True
    return False


def _preempt(seq: _Sequence, running: list, queue, pool: BlockPool) -> None:
    """Recompute preemption: free `seq`'s blocks and queue it first again."""
    running.remove(seq)
    pool.give(seq.blocks)
    seq.blocks = seq.cached = 0
    seq.served.preemptions += 1
    queue.appendleft(seq)


def _chunked(env, replica, total, queue, wakeups, cost, pool, limits, run, note):
    running: list[_Sequence] = []  # in admission order
    finished = 0
    while finished < total:
        budget, batch = limits.max_num_batched_tokens, []  # batch: [(seq, new tokens)]
        for seq in sorted(running, key=lambda s: s.tokens - s.cached > 1):  # decodes first
            if budget == 0:
                break
            q = min(seq.tokens - seq.cached, budget)
            while seq in running and not _grow(pool, seq, q):
                stepping = {id(s) for s, _ in batch}
                _preempt(next(s for s in reversed(running) if id(s) not in stepping),
                         running, queue, pool)
            if seq in running:
                batch.append((seq, q))
                budget -= q
        while queue and budget > 0 and len(running) < limits.max_num_seqs:
            seq = queue[0] if isinstance(queue[0], _Sequence) else _Sequence(queue[0])
            q = min(seq.tokens, budget)
            if not _grow(pool, seq, q):
                break
            queue.popleft()
            running.append(seq)
            batch.append((seq, q))
            budget -= q
        if not batch:
            wakeups[replica] = env.event()
            yield wakeups[replica]
            continue
        yield from _step(env, cost, [(q, s.cached) for s, q in batch], run, replica, pool)
        for seq, q in batch:
            seq.cached += q
            if seq.cached < seq.tokens:
                continue  # a prompt's chunk: no token yet
            seq.served.token_times.append(env.now)
            if seq.served.done:
                running.remove(seq)
                pool.give(seq.blocks)
                finished += 1
                note(-1)


def _static(env, replica, total, queue, wakeups, cost, pool, limits, run, note):
    size = limits.batch_size or 1
    finished = 0
    while finished < total:
        want = min(size, total - finished)
        while len(queue) < want:
            wakeups[replica] = env.event()
            yield wakeups[replica]
        batch = [_Sequence(queue.popleft()) for _ in range(want)]
        for seq in batch:
            seq.blocks = blocks_for(seq.served.request.input_tokens
                                    + seq.served.request.output_tokens)
            if not pool.take(seq.blocks):
                raise AssertionError("static batch checked to fit")
        yield from _step(env, cost, [(s.tokens, 0) for s in batch], run, replica, pool)
        finished += _emit(env, batch, note)
        steps = max(s.served.request.output_tokens for s in batch) - 1
        for _ in range(steps):
            yield from _step(env, cost, [(1, s.tokens - 1) for s in batch], run, replica,
                             pool)
            finished += _emit(env, [s for s in batch if not s.served.done], note)
        for seq in batch:  # finished sequences held their blocks (padding) until now
            pool.give(seq.blocks)


def _emit(env, batch: list[_Sequence], note) -> int:
    """Each sequence of `batch` makes a token now; the count of those that are done."""
    done = 0
    for seq in batch:
        seq.served.token_times.append(env.now)
        if seq.served.done:
            done += 1
            note(-1)
    return done


def duration(run: ServingRun) -> float:
    """Seconds from the first arrival to the last token."""
    first = min(s.request.arrival for s in run.served)
    return max(s.token_times[-1] for s in run.served) - first if run.served else math.nan
