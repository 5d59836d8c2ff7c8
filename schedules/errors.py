"""Typed errors a user can act on, and the shared checks that raise them. Each message
names the field and the rule it broke."""


class ClustersimError(Exception):
    """Base of every error clustersim raises on bad input; the CLI prints it as one line."""


class ConfigError(ClustersimError, ValueError):
    """An invalid model, parallel or schedule configuration (names the field and the rule)."""


def require_positive_int(name: str, value: object) -> None:
    """Raise ConfigError unless `value` is an int >= 1 (bools are not counts)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


class ScheduleFormatError(ClustersimError, ValueError):
    """A schedule text or CSV that cannot be parsed (names the row/cell and the rule)."""


class DeadlockError(ClustersimError):
    """A schedule whose ops can never all run.

    `stuck` maps each rank that did not finish to the op it is blocked on; `report` is the
    rank x step grid with the stuck steps marked.
    """

    def __init__(self, message: str, stuck: dict, report: str):
        super().__init__(message)
        self.stuck = stuck
        self.report = report

    def __str__(self) -> str:
        return f"{self.args[0]}\n{self.report}"
