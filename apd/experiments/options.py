"""Options of an experiment, given as ``--option KEY=VALUE`` on the command line and checked like a config
section (unknown keys, types, bounds) with one-line :class:`~apd.errors.ConfigError` messages."""

from __future__ import annotations

from typing import Any

from apd.config import build_section, parse_override
from apd.errors import ConfigError


def plan_from_options(options: list[str], plan: type) -> Any:
    """An instance of the dataclass ``plan`` from ``KEY=VALUE`` strings (module docstring)."""
    raw = {}
    for text in options:
        if "=" not in text:
            raise ConfigError(f"--option {text!r}: expected KEY=VALUE")
        keys, value = parse_override(text)
        raw[".".join(keys)] = value
    return build_section(plan, raw, "--option", prefix="")
