"""A lane's turns (sim.engine): a rank's collectives, host copies and host steps run on a
lane of their own, one after another in issue order."""
from __future__ import annotations

from collections.abc import Callable

import simpy


class LaneTurn:
    """An op's turn on its lane: `over` once it has ended; `until`, when it ends if that
    was known when it started (a run-ahead op, sim.run_ahead), else None; `then(f)`: call
    f() when it ends (the lane's next op starting), from `end` itself, not through an
    event (an event per turn was a fifth of a full replay's steps)."""

    __slots__ = ("env", "until", "over", "_next")

    def __init__(self, env: simpy.Environment, until: float | None = None):
        self.env, self.until, self.over, self._next = env, until, False, None

    def then(self, follow: Callable[[], None]) -> None:
        """Call `follow()` once this turn has ended: now if it has."""
        if self.over:
            follow()
        elif self._next is None:
            self._next = [follow]
        else:
            self._next.append(follow)

    def end(self) -> None:
        self.over = True
        follow, self._next = self._next, None
        for call in follow or ():
            call()
