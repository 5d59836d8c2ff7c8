"""argparse `type=` converters shared by the subcommands: each turns the text of one flag
into a value or raises argparse.ArgumentTypeError saying the rule (argparse then prints
one `clustersim <command>: error: argument --flag: ...` line)."""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def checked_number(convert: Callable[[str], float], accept: Callable[[float], bool],
                   rule: str) -> Callable[[str], float]:
    """A converter: `convert(text)` when `accept` holds for it, else the error '<text> is
    not <rule>'."""
    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            value = math.nan
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {rule}")
        return value
    return parse


positive_int = checked_number(int, lambda v: v >= 1, "an integer >= 1")
fraction = checked_number(float, lambda v: 0 < v <= 1, "a fraction in (0, 1]")
