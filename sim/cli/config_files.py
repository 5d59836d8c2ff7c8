"""Run flags from the files users already keep: `--config run.yaml|run.toml|run.json` (this
CLI's own flags), `--deepspeed-config ds.json` (sim.cli.deepspeed_config),
`--torchtitan-config job.toml` (sim.cli.torchtitan_config), and a Megatron-LM argument
list, from a file (`--megatron-args FILE`) or pasted after `--` (sim.cli.megatron_args).

Each source becomes command-line tokens of this CLI placed before the command line's own,
so a flag given on the command line overrides a file (argparse keeps the last value). The
flag table stays the one schema: a config file's key is a flag's dest or any of its
spellings without dashes (`tp`, `tensor-model-parallel-size`, `tensor_model_parallel_size`),
its value is checked by that flag's own type and choices, and an unknown key or a bad value
is one error naming the file and the key. (A typed-config library such as pydantic would
restate the table's types and choices as a second schema; this keeps one.) What another
framework's file sets that changes no modelled time or byte is accepted and listed in a
note; what it sets that the model cannot honour is refused by its translator.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clustersim.schedules.errors import ConfigError

from .config_reading import Settings, read_mapping
from .deepspeed_config import settings as deepspeed_settings
from .megatron_args import read_args
from .megatron_args import tokens as megatron_tokens
from .torchtitan_config import settings as torchtitan_settings

CONFIG_COMMANDS = ("simulate", "compare", "memory", "run", "sweep")
"""Commands whose flags a config file may set."""


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """The config-file options, for --help (sim.cli's main reads them before argparse)."""
    g = parser.add_argument_group("config files (command-line flags override them)")
    g.add_argument("--config", metavar="FILE",
                   help="YAML, TOML or JSON of this command's flags: keys are flag names "
                        "without dashes (tp: 4, tensor-model-parallel-size: 4, model: ...)")
    g.add_argument("--deepspeed-config", metavar="FILE",
                   help="a DeepSpeed config JSON (zero_optimization, offload, buckets, batch "
                        "sizes, bf16/fp16, activation_checkpointing)")
    g.add_argument("--torchtitan-config", metavar="FILE",
                   help="a torchtitan job TOML ([model], [training], [parallelism], "
                        "[activation_checkpoint], [compile], float8)")
    g.add_argument("--megatron-args", metavar="FILE",
                   help="a Megatron-LM argument list as its training script passes it (or "
                        "paste the list after `--`); flags with no effect on time or memory "
                        "are listed as ignored")


def flag_tokens(sub: argparse.ArgumentParser, source: str,
                values: Mapping[str, Any]) -> list[str]:
    """Command-line tokens of `sub` setting `values` ({flag name or dest: value}), each
    checked alone by the flag's own type and choices; errors name `source` and the key."""
    by_name: dict[str, list[argparse.Action]] = {}
    for action in sub._actions:
        if action.option_strings and action.dest not in ("help", *_CONFIG_DESTS):
            for name in (*action.option_strings, action.dest):
                by_name.setdefault(_key(name), []).append(action)
    tokens: list[str] = []
    for key, value in values.items():
        actions = by_name.get(_key(str(key)))
        if actions is None:
            raise ConfigError(f"{source}: unknown key {key!r}; rule: keys are this command's "
                              f"flags without dashes (see its --help)")
        mine = _tokens_for(actions, value, f"{source}: key {key!r}")
        with _raising(sub):
            try:
                sub.parse_args(mine)
            except ConfigError as err:
                raise ConfigError(f"{source}: key {key!r}: {err}") from None
        tokens += mine
    return tokens


_CONFIG_DESTS = ("config", "deepspeed_config", "torchtitan_config", "megatron_args")


def _key(name: str) -> str:
    return name.lstrip("-").replace("-", "_").lower()


def _tokens_for(actions: Sequence[argparse.Action], value: Any, where: str) -> list[str]:
    """The tokens that give `value` through one of `actions` (one flag's spellings, or the
    actions sharing a dest): a switch takes a bool; a valued flag a scalar or a list."""
    if all(action.nargs == 0 for action in actions):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: a switch takes true or false, got {value!r}")
        for action in actions:
            if isinstance(action, argparse.BooleanOptionalAction):
                return [action.option_strings[0 if value else 1]]
            if getattr(action, "const", None) is value:
                return [action.option_strings[0]]
        return []  # no flag turns it that way: the field keeps its default
    action = next(a for a in actions if a.nargs != 0)
    if isinstance(value, (dict, bool)) or value is None:
        raise ConfigError(f"{where}: {action.option_strings[0]} takes a value, got {value!r}")
    items = list(value) if isinstance(value, list) else [value]
    return [action.option_strings[0], *map(str, items)]


class _raising:
    """Within it, `parser`'s usage errors raise ConfigError (sim.cli._Parser.error)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def __enter__(self) -> None:
        self.parser.raising = True  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        self.parser.raising = False  # type: ignore[attr-defined]


def expand(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """`argv` with its config sources turned into flag tokens (module docstring), and the
    notes they produced (what was ignored, what was assumed)."""
    command = next((i for i, token in enumerate(argv) if not token.startswith("-")), None)
    if command is None or argv[command] not in CONFIG_COMMANDS:
        return argv, []
    sub = _subparser(parser, argv[command])
    head, rest = argv[:command + 1], argv[command + 1:]
    pasted: list[str] = []
    if "--" in rest:
        cut = rest.index("--")
        rest, pasted = rest[:cut], rest[cut + 1:]
    def translated(option: str, read: Callable[[str], tuple[Settings, list[str]]]
                   ) -> Callable[[str], tuple[list[str], list[str]]]:
        def run(path: str) -> tuple[list[str], list[str]]:
            found, notes = read(path)
            return [t for key, values in found
                    for t in flag_tokens(sub, f"{option} {path}: key {key!r}", values)], notes
        return run

    readers: dict[str, Callable[[str], tuple[list[str], list[str]]]] = {
        "--config": lambda path: (flag_tokens(sub, f"--config {path}",
                                              read_mapping(path, "--config")), []),
        "--deepspeed-config": translated("--deepspeed-config", deepspeed_settings),
        "--torchtitan-config": translated("--torchtitan-config", torchtitan_settings),
        "--megatron-args": lambda path: megatron(read_args(path), f"--megatron-args {path}"),
    }

    def megatron(args: list[str], source: str) -> tuple[list[str], list[str]]:
        tokens, notes = megatron_tokens(args, source)
        with _raising(sub):
            try:
                sub.parse_args(tokens)
            except ConfigError as err:
                raise ConfigError(f"{source}: {err}") from None
        return tokens, notes

    kept, from_files, notes = [], [], []
    i = 0
    while i < len(rest):
        option, _, inline = rest[i].partition("=")
        if option in readers:
            path = inline or (rest[i + 1] if i + 1 < len(rest) else None)
            if not path:
                raise ConfigError(f"{option} needs a file")
            tokens, said = readers[option](path)
            from_files += tokens
            notes += said
            i += 1 if inline else 2
            continue
        kept.append(rest[i])
        i += 1
    if pasted:
        tokens, said = megatron(pasted, "the Megatron arguments after --")
        from_files += tokens
        notes += said
    return head + from_files + kept, notes


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]
