"""The runs of `clustersim sweep`: from the flags given with lists or ranges to the
cartesian product of plain `simulate` argument lists, and one run's row (what a worker
executes). Units: seconds, tokens/s, GB (1e9 bytes).

One schema: the simulate parser (commands.add_simulate_flags) reads and checks every
value. Each flag's alternatives are checked alone, with that parser, before anything
runs (a typo is one error naming the flag); a combination the flags cannot make
together (tp not dividing the heads, a layout over the topology's GPUs, ...) is found
by the run itself and reported in its row (status 'error' and the one-line reason),
never ending the sweep. A flag given twice keeps its last value, as in simulate (a
config file's value yields to the command line's); a repeatable flag (--slow-gpu,
--slow-link, --fail-link) is one axis per occurrence.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clustersim.schedules.errors import ClustersimError, ConfigError, DeadlockError
from clustersim.topologies import TopologyError

from .. import progress
from ..gc_pause import gc_paused
from ..sweep_values import expand, switch_values
from .commands import add_simulate_flags, simulate_from_args
from .config_files import flag_tokens

MAX_ERROR = 300  # characters of a row's error line


class _RaisingParser(argparse.ArgumentParser):
    """argparse whose usage errors raise ConfigError (a run's row reports them)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


@functools.lru_cache(maxsize=1)
def simulate_parser() -> argparse.ArgumentParser:
    """`clustersim simulate`'s parser (once per process), raising instead of exiting."""
    parser = _RaisingParser(prog="clustersim simulate", add_help=False)
    add_simulate_flags(parser)
    return parser


@dataclass(frozen=True)
class Axis:
    """One flag's alternatives: `column` (the table's name for it), `values` (what the
    table shows) and `tokens` (the simulate arguments of each value)."""

    flag: str
    column: str
    values: tuple[Any, ...]
    tokens: tuple[tuple[str, ...], ...]

    @property
    def swept(self) -> bool:
        return len(self.values) > 1

    @property
    def kind(self) -> str:
        """The column's type (sim.sweep_table.KINDS)."""
        kinds = {type(value) for value in self.values}
        if kinds == {bool}:
            return "bool"
        if kinds == {int}:
            return "int"
        return "float" if kinds <= {int, float} else "str"


def own_commas(action: argparse.Action) -> bool:
    """A flag whose own value is a comma list (metavar F,B or LIST): its alternatives are
    separated by ';' (sim.sweep_values)."""
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    return "," in metavar or metavar == "LIST"


def _column(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def _typed(text: str) -> Any:
    """A value as the table stores it: an int, a float, or the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _check_alone(tokens: Sequence[str], flag: str) -> None:
    try:
        simulate_parser().parse_args(list(tokens))
    except ConfigError as err:
        raise ConfigError(f"{flag}: {err}") from None


def _valued_axis(action: argparse.Action, option: str, given: Sequence[str],
                 limit: int) -> Axis:
    choices = [expand(text, option, own_commas(action), limit) for text in given]
    combos = list(itertools.product(*choices))
    if len(combos) > limit:
        raise ConfigError(f"{option} gives {len(combos):,} values, above --max-runs {limit:,}")
    tokens = tuple((option, *combo) for combo in combos)
    for one in tokens:
        _check_alone(one, option)
    values = [_typed(c[0]) if len(c) == 1 else " ".join(c) for c in combos]
    if len({type(v) for v in values}) > 1 and not all(isinstance(v, (int, float))
                                                      for v in values):
        values = [" ".join(c) for c in combos]  # mixed: all as text
    return Axis(option, _column(action.option_strings[0]), tuple(values), tokens)


def _switch_axis(action: argparse.Action, option: str, given: str | None) -> Axis:
    if given is None:  # a plain switch: the same in every run
        return Axis(option, _column(option), (True,), ((option,),))
    sets = getattr(simulate_parser().parse_args([option]), action.dest)
    if not isinstance(sets, bool):
        raise ConfigError(f"{option} sets {action.dest} to {sets!r}, not on or off: sweep "
                          f"the flag that takes the value instead")
    values = switch_values(given, option)
    tokens = tuple((option,) if on else tuple(flag_tokens(simulate_parser(), option,
                                                          {action.dest: not sets}))
                   for on in values)
    return Axis(option, _column(option), tuple(values), tokens)


def build_axes(given: Sequence[tuple[argparse.Action, str, Any]], limit: int) -> list[Axis]:
    """The axes of the flags as given (action, option string, raw value(s)), in the order
    of their last occurrence; each value checked alone (module docstring)."""
    axes: dict[Any, Axis] = {}
    for position, (action, option, raw) in enumerate(given):
        if action.nargs == 0:
            axis = _switch_axis(action, option, raw)
        else:
            texts = [raw] if isinstance(raw, str) else list(raw)
            axis = _valued_axis(action, option, texts, limit)
        key = position if isinstance(action, argparse._AppendAction) else action.dest
        axes.pop(key, None)
        axes[key] = axis
    return _unique_columns(list(axes.values()))


def _unique_columns(axes: list[Axis]) -> list[Axis]:
    """A repeated flag's axes named slow_gpu, slow_gpu_2, ..."""
    seen: dict[str, int] = {}
    named = []
    for axis in axes:
        seen[axis.column] = seen.get(axis.column, 0) + 1
        column = axis.column if seen[axis.column] == 1 else f"{axis.column}_{seen[axis.column]}"
        named.append(Axis(axis.flag, column, axis.values, axis.tokens))
    return named


def count_runs(axes: Sequence[Axis]) -> int:
    return math.prod(len(axis.values) for axis in axes)


def check_size(axes: Sequence[Axis], max_runs: int) -> int:
    """The number of runs; ConfigError above `max_runs`, before anything runs."""
    runs = count_runs(axes)
    if runs > max_runs:
        shape = " x ".join(f"{axis.flag} {len(axis.values)}" for axis in axes if axis.swept)
        raise ConfigError(f"the sweep has {runs:,} runs ({shape}), above --max-runs "
                          f"{max_runs:,}: narrow the lists or raise --max-runs")
    return runs


def runs(axes: Sequence[Axis]) -> list[tuple[dict[str, Any], list[str]]]:
    """Every run of the product, in order: its swept values {column: value} and its
    simulate arguments."""
    out = []
    for picks in itertools.product(*(range(len(axis.values)) for axis in axes)):
        values = {axis.column: axis.values[i] for axis, i in zip(axes, picks) if axis.swept}
        tokens = [token for axis, i in zip(axes, picks) for token in axis.tokens[i]]
        out.append((values, tokens))
    return out


def simulate_row(tokens: Sequence[str]) -> dict[str, Any]:
    """One run (a worker calls it): the metrics and status of `clustersim simulate
    TOKENS`; a run that fails is a row with its reason, never an exception."""
    try:
        with progress.quiet(), gc_paused():
            args = simulate_parser().parse_args(list(tokens))
            *_, timeline = simulate_from_args(args)
            return _metrics(timeline)
    except DeadlockError as err:
        return _failed("error", err.args[0])
    except (ClustersimError, TopologyError) as err:
        return _failed("error", str(err))
    except Exception as err:  # noqa: BLE001 - one broken run must not end the sweep
        return _failed("crash", f"{type(err).__name__}: {err}")


def _failed(status: str, message: str) -> dict[str, Any]:
    line = (message.splitlines() or [""])[0]
    return {"status": status, "error": line[:MAX_ERROR]}


def _metrics(timeline: Any) -> dict[str, Any]:
    figures = timeline.meta["throughput"]
    peak = max(timeline.peak_memory().values(), default=0.0) / 1e9
    over = timeline.meta.get("oom_ranks") or []
    return {"iteration_time_s": timeline.iteration_time,
            "tokens_per_s": figures["tokens_per_s"],
            "tokens_per_s_per_gpu": figures["tokens_per_s_per_gpu"], "mfu": figures["mfu"],
            "bubble_fraction": timeline.bubble_fraction, "peak_memory_gb": peak,
            "status": "oom" if over else "ok",
            "error": (f"out of memory: peak {peak:.1f} GB on ranks {over} is above the "
                      f"device's memory") if over else None}
