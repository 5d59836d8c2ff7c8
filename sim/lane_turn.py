"""A lane's turns (sim.engine): a rank's collectives, host copies and host steps run on a
lane of their own, one after another in issue order."""
from __future__ import annotations

import simpy


class LaneTurn:
    """An op's turn on its lane: `over` once it has ended; `until`, when it ends if that
    was known when it started (a run-ahead op, sim.run_ahead), else None; `event()`, the
    event a later op of the lane waits for, is made only when one does (a lane is mostly
    free again by its next post, and an event nobody waits for is a step of the replay for
    nothing)."""

    __slots__ = ("env", "until", "over", "_event")

    def __init__(self, env: simpy.Environment, until: float | None = None):
        self.env, self.until, self.over, self._event = env, until, False, None

    def event(self) -> simpy.Event:
        if self._event is None:
            self._event = self.env.event()
        return self._event

    def end(self) -> None:
        self.over = True
        if self._event is not None:
            self._event.succeed()
