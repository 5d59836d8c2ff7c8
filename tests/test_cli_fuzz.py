"""Random command lines (issue 15): hypothesis draws a subcommand, up to six of its own
flags (read from the real parser, so a new flag is fuzzed as soon as it exists) and for
each a value from a mix of valid, boundary and junk values, and runs `clustersim` in this
process (sim.cli.main, the code a user's command runs). Every run must end in a result
(exit 0) or a clear error (exit 2 with one `clustersim: error:` line; argparse's usage
error is exit 2 as well; a deadlocked schedule exit 3) — never an uncaught exception, and
within the harness's time bound. The hardware commands (calibrate, run) start processes
and are covered by tests/test_kernels_limits.py and tests/test_kernels_lifecycle.py.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import signal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustersim.schedules.registry import SCHEDULES
from clustersim.sim.cli import EXIT_DEADLOCK, EXIT_USAGE, build_parser, main

HARNESS_S = 60  # per command line; a hang fails the example
COMMANDS = ("simulate", "show", "compare", "memory", "collective", "models", "topologies")
SKIPPED = {"help", "version"}
OUTPUTS = {"output", "trace_json", "metrics_json", "timeline_json"}
INPUTS = {"schedule_csv", "profile", "topology", "gemm_table"}
VALID = ["1", "2", "4", "8"]  # half the command lines use only these (and choices)
BASE = {"simulate": ["--model", "gpt3-1.3b"], "memory": ["--model", "gpt3-1.3b"],
        "compare": ["--model", "gpt3-1.3b"], "show": ["--pp", "2", "--microbatches", "4"],
        "collective": ["--size", "1e6"]}  # what those command lines start with
JUNK = ["0", "-1", "3", "1.5", "1e400", "nan", "inf", "-inf", "1000000000",
        "99999999999999999999", "abc", "", "²", "0x10", "1,2", "-"]
FILES = {
    "good.csv": "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n",
    "bad.csv": "0F0,0Q1\n",
    "binary.bin": "\x00\xff",
    "nested.json": "[" * 500 + "]" * 500,
    "empty.json": "{}",
    "timeline.json": '{"source": "sim", "meta": {}, "memory": [], "spans": [{"rank": 0, '
                     '"lane": "compute", "op": "0F0", "start": 0, "end": 1}]}',
}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: action.choices[name] for name in COMMANDS}


PARSERS = _subparsers()


def _values(action: argparse.Action, junk: bool) -> st.SearchStrategy[list[str]]:
    """The words that follow `action`'s flag (none for a switch); paths are relative to
    the folder the command runs in, which holds FILES. Without `junk`, numbers are
    VALID's and names the flag's choices."""
    if action.nargs == 0:
        return st.just([])
    if action.dest in OUTPUTS:
        words = ["out/x.out", "good.csv", ".", "", "/proc/nope/x.html"]
    elif action.dest in INPUTS:
        words = [*FILES, "missing", "dgx-h100", "", "nope"]
    else:
        words = [str(c) for c in (action.choices or ())] or VALID
        words = JUNK + words if junk else words
    return st.sampled_from(words).map(lambda word: [word])


def _positionals(command: str) -> st.SearchStrategy[list[str]]:
    if command == "show":
        return st.sampled_from([*SCHEDULES, "nope", ""]).map(lambda s: [s])
    if command == "collective":
        return st.sampled_from(["all_reduce", "all_gather", "all-to-all", "nope", ""]).map(
            lambda s: [s])
    if command == "compare":
        return st.lists(st.sampled_from([*FILES, "missing"]), max_size=2)
    return st.just([])


@st.composite
def command_lines(draw) -> list[str]:
    command = draw(st.sampled_from(COMMANDS))
    flags = [a for a in PARSERS[command]._actions
             if a.option_strings and a.dest not in SKIPPED]
    chosen = draw(st.lists(st.sampled_from(flags), max_size=6,
                           unique_by=lambda a: a.dest)) if flags else []
    junk = draw(st.booleans())
    words = [command, *draw(_positionals(command)), *([] if junk else BASE.get(command, []))]
    for action in chosen:
        words += [draw(st.sampled_from(action.option_strings)), *draw(_values(action, junk))]
    return words


def read_by(words: list[str]) -> set[str]:
    """The FILES a command line reads: its positionals and the values of input flags (a
    file named only as an output may be replaced: the user asked for it)."""
    command = words[0]
    inputs = {s for a in PARSERS[command]._actions if a.dest in INPUTS for s in a.option_strings}
    named = {w for i, w in enumerate(words[1:], 1) if words[i - 1] in inputs}
    outputs = {s for a in PARSERS[command]._actions if a.dest in OUTPUTS
               for s in a.option_strings}
    positional = {w for i, w in enumerate(words[1:], 1)
                  if words[i - 1] not in outputs and not w.startswith("-")
                  and command in ("compare",)}
    return (named | positional) & set(FILES)


def _alarm(signum, frame):
    raise TimeoutError(f"a command line ran past the harness bound of {HARNESS_S} s")


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(words=command_lines())
def test_a_random_command_line_ends_in_a_result_or_one_clear_error(words, tmp_path,
                                                                   monkeypatch):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HARNESS_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(words)
            except SystemExit as exit_:  # argparse: usage errors
                code = exit_.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    lines = err.getvalue().strip().splitlines()
    assert code in (0, EXIT_USAGE, EXIT_DEADLOCK), (words, code, lines)
    if code:
        assert lines and "error:" in lines[0], (words, lines)
        assert "Traceback" not in err.getvalue(), (words, lines)
    for name in read_by(words):  # an output never overwrote one of the run's inputs
        assert (tmp_path / name).read_text() == FILES[name], (words, name)


def test_the_fuzzed_parsers_have_their_flags():
    """The strategy reads the flags from the parser: it must find them."""
    assert {"--pp", "--microbatches", "--schedule-csv", "--output"} <= {
        s for a in PARSERS["simulate"]._actions for s in a.option_strings}
