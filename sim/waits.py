"""Who waited for whom in a full replay (sim.world): each collective starts once the last
of its group's members has posted it, so the others wait for that one. The engine records
on each member's span `waited_s` (seconds from its post to the start) and `last` (the
member posted last, None when all posted at once); here they are summed per last rank."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from clustersim.schedules.timeline import Span

from .span_info import WaitedInfo

TOP = 5  # ranks named in the summary line


def waited_for(spans: Iterable[Span]) -> list[dict]:
    """Per rank that others waited for: {'rank', 'waiting_ranks', 'wait_s' (summed over
    the ranks that waited, rank-seconds), 'collectives'}, most wait first."""
    wait: dict[int, float] = defaultdict(float)
    waiters: dict[int, set[int]] = defaultdict(set)
    collectives: dict[int, set[tuple]] = defaultdict(set)
    for span in spans:
        info = span.info
        if type(info) is WaitedInfo:  # the engine's (a million in a full replay): its
            last, waited = info.last, info.waited_s  # slots, not Mapping's get
        elif info and info.get("last") is not None:  # a plain mapping with the same keys
            last, waited = info["last"], info["waited_s"]
        else:
            continue
        if last is None:
            continue
        if span.rank != last and waited > 0:
            wait[last] += waited
            waiters[last].add(span.rank)
            collectives[last].add((span.lane, span.start))
    return sorted(({"rank": r, "waiting_ranks": len(waiters[r]), "wait_s": wait[r],
                    "collectives": len(collectives[r])} for r in wait),
                  key=lambda row: -row["wait_s"])


def waits_note(rows: list[dict]) -> str | None:
    """One line naming the ranks most waited for, or None when nobody waited."""
    if not rows:
        return None
    named = "; ".join(f"rank {row['rank']} held up {row['waiting_ranks']} ranks for "
                      f"{row['wait_s']:.4g} rank-s over {row['collectives']} collectives"
                      for row in rows[:TOP])
    return f"who waited for whom (collectives start when their last member posts): {named}"
