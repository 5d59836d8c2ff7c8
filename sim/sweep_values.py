"""The value syntax of `clustersim sweep`: a flag's value is a list of alternatives.

- a list: `2,4,8` (for a flag whose own value is a comma list, such as --uniform-costs
  F,B: `'1,2;1,3'`, alternatives separated by ';');
- a range, both ends included when reached: `a..b` (step 1), `a..b+s` (additive step s),
  `a..bxk` (multiplicative step k > 1, a > 0): `8..64x2` = 8,16,32,64, `1..2+0.25` =
  1,1.25,1.5,1.75,2;
- a list of lists and ranges: `1,2..8x2` = 1,2,4,8; repeated values are dropped;
- a switch: `--sequence-parallel=on,off` (on/off, true/false, yes/no, 1/0).
Numbers of a range are decimals (exact: no float drift in `0.1..0.3+0.1`). Each value
stays text: the simulate parser reads and checks it (sim.cli.sweep_command).
Every error is a ConfigError naming the flag and the rule.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from clustersim.schedules.errors import ConfigError

NUMBER = r"-?\d+(?:\.\d+)?"
RANGE = re.compile(rf"^({NUMBER})\.\.({NUMBER})(?:([x+])(\d+(?:\.\d+)?))?$")
BROKEN_RANGE = re.compile(r"^-?\d[\d.]*\.\.")  # starts like a range but is none
SWITCH_WORDS = {"on": True, "true": True, "yes": True, "1": True,
                "off": False, "false": False, "no": False, "0": False}
SYNTAX = ("a list 2,4,8 (';' between values that hold commas themselves), a range a..b "
          "(step 1), a..b+s (additive step) or a..bxk (multiplicative step), or lists of "
          "both: 1,2..8x2")


def expand(text: str, flag: str, own_commas: bool = False, limit: int = 100_000
           ) -> list[str]:
    """The alternatives `text` gives for `flag` (module docstring), in order, without
    repeats; ConfigError for a malformed range or more than `limit` values."""
    separator = ";" if own_commas else ","
    items = [item.strip() for item in text.split(separator)]
    if not any(items):
        raise ConfigError(f"{flag} {text!r}: no value; give {SYNTAX}")
    values: list[str] = []
    for item in filter(None, items):
        match = RANGE.match(item)
        if match:
            values += _range(match, item, flag, limit)
        elif BROKEN_RANGE.match(item):
            raise ConfigError(f"{flag} {item!r} is not a range: write a..b, a..b+s or "
                              f"a..bxk (e.g. 8..64x2)")
        else:
            values.append(item)
        if len(values) > limit:
            raise ConfigError(f"{flag} {text!r} gives more than {limit:,} values "
                              f"(--max-runs): narrow it")
    return list(dict.fromkeys(values))


def _range(match: re.Match, item: str, flag: str, limit: int) -> list[str]:
    start, end, kind, step_text = match.groups()
    try:
        first, last = Decimal(start), Decimal(end)
        step = Decimal(step_text) if step_text else Decimal(1)
    except InvalidOperation:  # the pattern admits only numbers; kept for safety
        raise ConfigError(f"{flag} {item!r}: the ends and step must be numbers") from None
    if first > last:
        raise ConfigError(f"{flag} {item!r}: the range runs down; give a..b with a <= b")
    if kind == "x" and not (step > 1 and first > 0):
        raise ConfigError(f"{flag} {item!r}: a multiplicative range a..bxk needs k > 1 "
                          f"and a > 0")
    if kind != "x" and step <= 0:
        raise ConfigError(f"{flag} {item!r}: the step of a..b+s must be > 0")
    values, value = [], first
    while value <= last:
        values.append(_text(value))
        if len(values) > limit:
            raise ConfigError(f"{flag} {item!r} gives more than {limit:,} values "
                              f"(--max-runs): narrow it")
        value = value * step if kind == "x" else value + step
    return values


def _text(value: Decimal) -> str:
    """8, 0.75, 4.5: no exponent, no trailing zeros."""
    text = f"{value.normalize():f}"
    return "0" if text == "-0" else text


def switch_values(text: str, flag: str) -> list[bool]:
    """The on/off alternatives of a switch: `on,off` -> [True, False]."""
    values = []
    for item in filter(None, (part.strip().lower() for part in text.split(","))):
        if item not in SWITCH_WORDS:
            raise ConfigError(f"{flag}={text}: a switch takes on or off (true/false, "
                              f"yes/no, 1/0), got {item!r}")
        values.append(SWITCH_WORDS[item])
    if not values:
        raise ConfigError(f"{flag}={text}: no value; give on, off or on,off")
    return list(dict.fromkeys(values))
