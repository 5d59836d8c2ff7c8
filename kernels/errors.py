"""The error the kernels backend raises when a run fails: it names the rank and the op."""
from __future__ import annotations

from clustersim.schedules.errors import ClustersimError


class KernelsError(ClustersimError, RuntimeError):
    """A real run failed: a rank raised or died, a transfer or collective never completed
    within the timeout, or the schedule/config cannot run on this backend or device.

    `rank` and `op` (its text form, e.g. '1RECV_F0') say where, when known; `details`
    holds the failing rank's traceback."""

    def __init__(self, message: str, rank: int | None = None, op: str | None = None,
                 details: str = ""):
        super().__init__(message)
        self.rank, self.op, self.details = rank, op, details
