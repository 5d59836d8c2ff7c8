"""The schedule registry: one entry per pipeline schedule, from which the CLI's choices
and help, ParallelConfig's checks, `build_schedule` and the property tests all derive.

Each schedule family is one module of `schedules.pipelines` that defines SCHEDULES, a
list of ScheduleEntry; the registry collects every such module at import, so adding a
schedule is one new module there and its test (docs/architecture.md, "Add a schedule").
An entry's `programs(pp, microbatches, vpp)` returns the compute-only programs (F and B,
or F, I and W) of each pipeline rank; `build` checks the entry's rules, places the
stages (schedules.placement) and wraps them in a Schedule.
"""
from __future__ import annotations

import importlib
import pkgutil

from . import pipelines
from .errors import ConfigError
from .limits import MAX_OPS
from .schedule import Schedule
from .schedule_entry import ScheduleEntry

DEFAULT_SCHEDULE = "1f1b"


def _collect() -> dict[str, ScheduleEntry]:
    entries: dict[str, ScheduleEntry] = {}
    for info in sorted(pkgutil.iter_modules(pipelines.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{pipelines.__name__}.{info.name}")
        for entry in getattr(module, "SCHEDULES", ()):
            if entry.name in entries:
                raise ValueError(f"schedule {entry.name!r} is registered twice")
            entries[entry.name] = entry
    return dict(sorted(entries.items(), key=lambda kv: _ORDER.get(kv[0], len(_ORDER))))


_ORDER = {"gpipe": 0, "1f1b": 1, "interleaved-1f1b": 2}  # the classic three first in help
SCHEDULES: dict[str, ScheduleEntry] = _collect()


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


_SPELLINGS = {spelling: entry.name for entry in SCHEDULES.values()
              for alias in (entry.name, *entry.aliases)
              for spelling in (_key(alias), _key(alias).replace("-", ""))}


RUNTIME_BASE_CLASSES = ("pipelineschedulesingle", "pipelineschedulemulti")
"""Names torch's get_schedule_class also accepts: the base classes that run an order loaded
from a CSV (torchtitan's pipeline_parallel_schedule_csv), not schedules of their own."""


def schedule_entry(name: str) -> ScheduleEntry:
    """The entry of `name` or one of its aliases; ConfigError listing the choices."""
    key = _key(name)
    canonical = _SPELLINGS.get(key) or _SPELLINGS.get(key.replace("-", ""))
    if canonical is None and key.replace("-", "") in RUNTIME_BASE_CLASSES:
        raise ConfigError(f"schedule {name!r} is torch's runtime for an order loaded from a "
                          f"CSV, not a schedule of its own: give the order with "
                          f"--schedule-csv PATH (torch.distributed.pipelining's CSV format)")
    if canonical is None:
        raise ConfigError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")
    return SCHEDULES[canonical]


def canonical_schedule_name(name: str) -> str:
    return schedule_entry(name).name


def build_schedule(name: str, pp: int, microbatches: int, vpp: int | None = None,
                   max_ops: int = MAX_OPS) -> Schedule:
    """Compute-only schedule by name (aliases accepted; vpp None = the entry's default;
    `max_ops`: the op budget, schedules.limits)."""
    return schedule_entry(name).build(pp, microbatches, vpp, max_ops)


def schedule_help() -> str:
    """One line per schedule for the CLI's help: name, aliases, vpp rule, source."""
    lines = []
    for e in SCHEDULES.values():
        vpp = (f"vpp {e.max_vpp}" if e.max_vpp == e.min_vpp else
               f"vpp >= {e.min_vpp} (default {e.default_vpp})")
        lines.append(f"{e.name} ({vpp}; {e.placement} placement): {e.summary} [{e.source}]")
    return "; ".join(lines)
