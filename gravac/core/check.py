"""Checking a config dataclass built from plain values: keys, types, declared ranges and
choices, the class's own cross-field rules. The one validator every config section, compressor
option set and DDP-hook keyword set goes through. Part of gravac.core: imports nothing of the
project outside it.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Mapping

from gravac.core import schema
from gravac.core.registry import field_errors


class ConfigError(ValueError):
    """A config value a user typed is wrong; the message is one line meant for the user."""


def _build(cls: type, data: Mapping, path: str) -> Any:
    """Dataclass `cls` from a mapping, checking keys and types."""
    hints = typing.get_type_hints(cls, vars(schema))
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {path}.{unknown[0]}; valid keys under {path}: {', '.join(fields)}")
    return cls(**{k: _coerce(hints[k], v, f"{path}.{k}") for k, v in data.items()})


def _coerce(hint: Any, value: Any, key: str) -> Any:
    """Check `value` against a field's type hint, allowing int where float is expected."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # Optional[...], X | None
        if value is None:
            return None
        hint = [a for a in typing.get_args(hint) if a is not type(None)][0]
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} is not a boolean (use true or false)")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} is not an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(f"{key}={value!r} must be a finite number")
            return float(value)
        raise ConfigError(f"{key}={value!r} is not a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}={value!r} is not a string")
    if hint is list or origin is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        raise ConfigError(f"{key}={value!r} is not a list (use [a,b,...])")
    return value


def checked(cls: type, values: Mapping, path: str) -> Any:
    """Dataclass `cls` from `values` with every check a config section gets: keys, types,
    declared ranges and choices, the class's own cross-field rules; ConfigError names the first
    problem as `path.key=value ...`. The DDP hooks (gravac/hooks/hooks.py) check their keywords here."""
    obj = _build(cls, values, path)
    check_section(obj, path)
    return obj


def check_section(section: Any, name: str) -> None:
    problems = field_errors(section, name)
    problems += section.errors(name) if hasattr(section, "errors") else []
    if problems:
        raise ConfigError(problems[0])
