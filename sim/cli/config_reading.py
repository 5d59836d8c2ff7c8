"""Reading a run's config file (sim.cli.config_files): the top-level mapping of a YAML,
TOML or JSON file, one error line naming the file when it is not one."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from clustersim.schedules.errors import ConfigError
from clustersim.user_files import read_text

Settings = list[tuple[str, dict[str, Any]]]
"""What a translator sets: (the file's key, {this CLI's flag name or dest: value})."""
MAX_CONFIG_BYTES = 1 << 20  # a run's config above 1 MiB is not a config


def read_mapping(path: str, what: str) -> dict[str, Any]:
    """The top-level mapping of YAML (.yaml, .yml), TOML (.toml) or JSON (.json) file
    `path`; ConfigError naming the file otherwise."""
    source = f"{what} {path}"
    text = read_text(path, source, ConfigError, MAX_CONFIG_BYTES)
    suffix = Path(path).suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            import yaml
            data = yaml.safe_load(text)
        elif suffix == ".toml":
            data = _toml().loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"{source}: unknown format {suffix or '(no suffix)'!r}; rule: "
                              f"name it .yaml, .yml, .toml or .json")
    except ConfigError:
        raise
    except Exception as exc:  # each parser's own error class; one line, no traceback
        reason = " ".join(str(exc).split())
        raise ConfigError(f"{source}: not valid {suffix[1:].upper()}: {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys to values, got "
                          f"{type(data).__name__}")
    return data


def _toml() -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    import tomli
    return tomli
