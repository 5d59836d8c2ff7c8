"""The `clustersim` command line: simulate, show, compare, memory, collective, plan, jobs,
sweep, serve; calibrate and run on hardware (sim.cli.commands, .hardware, .memory_report,
.collective_report, .plan_command, .jobs_command, .sweep_command, .serve_command; the flags
and the fields they set: sim.cli.flags). A command line imports only its command's module
(`MODULES`): the others pull in the planner, serving and plotting, about a third of
the start-up time of a `collective` run; `clustersim --help` and an unknown command build
them all.

Every error a user can cause ends in one `clustersim: error: ...` line (a deadlock adds
its rank x step report) and a non-zero exit, never a traceback. A value the user gave that
the line repeats is cut to its first MAX_ECHO characters (`shorten`).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import logging
import os
import re
import sys

from clustersim import __version__
from clustersim.schedules.errors import ClustersimError, ConfigError, DeadlockError
from clustersim.topologies import TopologyError

from .. import progress
from ..gc_pause import gc_paused
from . import config_files

EXIT_USAGE, EXIT_DEADLOCK, EXIT_INTERRUPTED = 2, 3, 130  # 130: 128 + SIGINT, as shells do
MAX_ECHO = 200  # characters of one word (a value echoed back) in an error line


def shorten(message: str) -> str:
    """`message` with every word longer than MAX_ECHO characters cut, saying how long it
    was (a 100,000-character model name echoed back would bury the rule)."""
    return re.sub(rf"\S{{{MAX_ECHO + 1},}}",
                  lambda m: f"{m[0][:MAX_ECHO]}...({len(m[0]):,} characters)", message)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump), like every other error."""

    raising = False  # sim.cli.config_files checks a file's values with errors raised

    def error(self, message: str) -> None:  # type: ignore[override]
        if self.raising:
            raise ConfigError(message)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {shorten(message)} "
                              f"(see {self.prog} --help)\n")


MODULES = {"simulate": "commands", "show": "commands", "compare": "commands",
           "models": "commands", "topologies": "commands", "calibrate": "hardware",
           "run": "hardware", "memory": "memory_report", "collective": "collective_report",
           "plan": "plan_command", "jobs": "jobs_command", "sweep": "sweep_command",
           "serve": "serve_command"}
"""Each command's module in sim.cli, in `clustersim --help`'s order: it adds the command's
parser (`add_parser`, or `add_parsers` for several) and runs it (its `COMMANDS`)."""


def _module(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of `command`'s module when it names one."""
    parser = _Parser(
        prog="clustersim",
        description="Discrete-event simulator of distributed LLM training and serving.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"clustersim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = [MODULES[command]] if command in MODULES else dict.fromkeys(MODULES.values())
    for name in names:
        module = _module(name)
        (module.add_parser if hasattr(module, "add_parser") else module.add_parsers)(sub)
    return parser


SIMULATING = ("simulate", "compare", "show", "collective", "memory", "plan", "jobs", "serve")
"""Commands that run in this process with the cyclic garbage collector paused
(sim.gc_pause); the hardware commands keep it."""


LEAVE_FAST = ("simulate", "compare", "show", "collective", "memory", "serve")
"""Commands that, run as the `clustersim` program (`command`), end the process as soon as
their output is flushed: no collection of the cyclic garbage collector after the pause,
no freeing of the run's objects one by one; the operating system frees the process (about
0.5 s of the README's 175B run). Commands that start worker processes (plan, jobs'
joblib or cluster clients) exit normally, so that their clean-up runs."""


def command() -> None:
    """The `clustersim` program (pyproject's script; `python -m clustersim`)."""
    sys.exit(main(leave=True))


def main(argv: list[str] | None = None, leave: bool = False) -> int:
    """Run one command line; its exit code. `leave`: a LEAVE_FAST command ends the process
    once its output is flushed, instead of returning (`command`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(next((word for word in argv if not word.startswith("-")), None))
    try:
        argv, notes = config_files.expand(argv, parser)
    except ClustersimError as err:
        print(f"clustersim: error: {shorten(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="clustersim: %(levelname)s: %(message)s")
    leaving = leave and args.command in LEAVE_FAST
    if leaving:
        gc.disable()  # for good: the process ends after the command (LEAVE_FAST)
    try:
        with progress.reporting(), (gc_paused() if args.command in SIMULATING and not leaving
                                    else contextlib.nullcontext()):
            code = _module(MODULES[args.command]).COMMANDS[args.command](args)
        for note in notes:  # what the config files set aside; after the run, so that an
            print(f"clustersim: note: {shorten(note)}", file=sys.stderr)  # error stays one line
        if leaving:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except DeadlockError as err:
        print(f"clustersim: error: {err.args[0]}", file=sys.stderr)
        print(err.report, file=sys.stderr)
        return EXIT_DEADLOCK
    except (ClustersimError, TopologyError) as err:
        print(f"clustersim: error: {shorten(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C: what was written so far stays (outputs are atomic)
        print("clustersim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        sys.stderr.close()
        return 0
    except OSError as err:
        print(shorten(f"clustersim: error: {err.filename or ''}: {err.strerror or err}"),
              file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    command()
