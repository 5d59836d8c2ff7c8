"""Structural checks and a unit-time dry run that finds deadlocks.

The dry run executes the execution contract (schedules.contract) with every compute op
taking one step and communication taking none (a collective's other members are the
same program rank in other replicas, so they post it at the same step). It yields the rank x step grid that
`clustersim show` prints, and, when some ops can never run, a DeadlockError whose report
is that grid with each rank's stuck op marked `>op<`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .contract import Key, p2p_peer, prerequisites, produces
from .errors import ConfigError, DeadlockError
from .ops import Op, OpKind
from .p2p import add_p2p
from .schedule import Schedule


@dataclass
class DryRun:
    """Unit-time execution: `steps[r]` lists (op, start step) of rank r's compute ops."""

    steps: list[list[tuple[Op, int]]]
    makespan: int

    def grid(self, stuck: dict[int, Op] | None = None) -> str:
        """Rank x step table; idle steps are `.`; stuck ops appear as `>op<` after the end."""
        stuck = stuck or {}
        cells = []
        for r, ops in enumerate(self.steps):
            row = ["."] * self.makespan
            for op, t in ops:
                row[t] = str(op)
            if r in stuck:
                row.append(f">{stuck[r]}<")
            cells.append(row)
        width = max([len(c) for row in cells for c in row] + [3])
        ncols = max(len(row) for row in cells)
        header = "step   " + " ".join(f"{i:>{width}}" for i in range(ncols))
        lines = [header]
        for r, row in enumerate(cells):
            lines.append(f"rank {r:<2}" + " ".join(f"{c:>{width}}" for c in row))
        return "\n".join(lines)


def check_structure(schedule: Schedule) -> None:
    """Every (stage, microbatch) has exactly one F and one backward, on the right rank."""
    m_count, s_count = schedule.num_microbatches, schedule.num_stages
    seen: Counter = Counter()
    for rank, program in enumerate(schedule.programs):
        for op in program:
            if op.stage < 0 or op.stage >= s_count:
                raise ConfigError(f"rank {rank}: op {op} names stage {op.stage}, "
                                  f"schedule has stages 0..{s_count - 1}")
            if schedule.rank_of_stage(op.stage) != rank:
                raise ConfigError(f"rank {rank}: op {op} belongs to stage {op.stage}, which "
                                  f"lives on rank {schedule.rank_of_stage(op.stage)}")
            if op.microbatch is not None and not 0 <= op.microbatch < m_count:
                raise ConfigError(f"rank {rank}: op {op} names microbatch {op.microbatch}, "
                                  f"schedule has microbatches 0..{m_count - 1}")
            seen[op.key] += 1
    for key, n in seen.items():
        if n > 1:
            kind, s, m = key
            raise ConfigError(f"op {s}{kind.value}{m} appears {n} times; each op must run once")
    for s in range(s_count):
        for m in range(m_count):
            if not seen[(OpKind.F, s, m)]:
                raise ConfigError(f"missing forward {s}F{m}")
            full = seen[(OpKind.B, s, m)]
            split = seen[(OpKind.I, s, m)], seen[(OpKind.W, s, m)]
            if not (full == 1 and split == (0, 0) or full == 0 and split == (1, 1)):
                raise ConfigError(f"stage {s} microbatch {m} needs one backward: either "
                                  f"{s}B{m}, or both {s}I{m} and {s}W{m}")


def dry_run(schedule: Schedule) -> DryRun:
    """Run the contract with unit compute time; raise DeadlockError if it cannot finish."""
    lowered = add_p2p(schedule)
    programs, ranks = lowered.programs, lowered.stage_ranks
    done: dict[Key, int] = {}      # key -> step at which its product is available
    posted: dict[Key, int] = {}    # p2p key -> step at which it was posted
    clock = [0] * len(programs)
    pc = [0] * len(programs)
    steps: list[list[tuple[Op, int]]] = [[] for _ in programs]

    progress = True
    while progress:
        progress = False
        for r, program in enumerate(programs):
            while pc[r] < len(program):
                op = program[pc[r]]
                needs = prerequisites(op, ranks, lowered.num_microbatches)
                if any(n not in done for n in needs):
                    break
                start = max([clock[r]] + [done[n] for n in needs])
                if op.kind.is_compute:
                    steps[r].append((op, start))
                    clock[r] = start + 1
                    for key in produces(op):
                        done[key] = start + 1
                elif op.kind.is_p2p:
                    posted[op.key] = start
                    peer = p2p_peer(op)
                    if peer in posted:
                        done[op.key] = done[peer] = max(start, posted[peer])
                elif op.kind.is_collective:
                    done[op.key] = start  # members are symmetric replicas: all post now
                pc[r] += 1
                progress = True

    result = DryRun(steps, max(clock))
    stuck = {r: programs[r][pc[r]] for r in range(len(programs)) if pc[r] < len(programs[r])}
    if stuck:
        lines = []
        for r, op in stuck.items():
            missing = [n for n in prerequisites(op, ranks, lowered.num_microbatches)
                       if n not in done]
            waits = ", ".join(_describe_wait(n, posted) for n in missing)
            lines.append(f"rank {r} stuck at {op} waiting for {waits}")
        raise DeadlockError(
            f"deadlock: {len(stuck)} rank(s) can never finish; " + "; ".join(lines),
            stuck, result.grid(stuck),
        )
    return result


def _describe_wait(key: Key, posted: dict[Key, int]) -> str:
    kind, stage, microbatch = key
    text = f"{stage}{kind.value}{microbatch}"
    if kind.is_p2p:
        p_kind, p_stage, p_mb = p2p_peer(Op(kind, stage, microbatch))
        if key in posted:
            return f"{text} (its peer {p_stage}{p_kind.value}{p_mb} is never posted)"
        return f"{text} (never posted)"
    return text


def validate(schedule: Schedule) -> DryRun:
    """Check structure, then dry-run; returns the dry run of a valid schedule."""
    check_structure(schedule)
    return dry_run(schedule)
