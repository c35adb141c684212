"""Typed settings from plain dicts: a dataclass is the schema of a config node.

`from_dict(SORLConfig, {...}, "agent")` checks every value against the dataclass's annotations (`Literal`
for a fixed set of choices, `X | None` and other unions, tuples, nested dataclasses), rejects unknown keys (naming the
closest known one), fills missing keys from the field defaults, and runs the dataclass's own range
checks (`__post_init__` raising ValueError with a message that starts with the field's name). Every
failure is a ConfigError whose message names the dotted key. `robo_rl/config.py` validates whole script
configs with it; `robo_rl/checkpoint.py` builds agents and planners from config groups with it.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Literal


def to_plain(settings: Any) -> dict:
    """A config as plain dicts and lists: a typed config (dataclasses, from `from_dict`) or an OmegaConf node alike.
    What checkpoints, metrics and wandb record."""
    if is_dataclass(settings):
        return _plain(dataclasses.asdict(settings))
    from omegaconf import OmegaConf

    return OmegaConf.to_container(settings, resolve=True) if OmegaConf.is_config(settings) else _plain(dict(settings))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the fix, on one line."""


def from_dict(schema: type, node: Any, key: str = "") -> Any:
    """`schema` instance from a plain dict, every value checked; `key` is the node's dotted path."""
    prefix = f"{key}." if key else ""
    if not isinstance(node, dict):
        raise ConfigError(f"{key}={node!r}: expected a group of keys ({', '.join(f.name for f in fields(schema))})")
    hints = typing.get_type_hints(schema)
    for name in node:
        if name not in hints:
            close = difflib.get_close_matches(name, list(hints), n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            raise ConfigError(f"unknown key {prefix}{name}: nothing reads it{hint}; remove it or fix its spelling")
    for f in fields(schema):
        if f.name not in node and f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"missing key {prefix}{f.name}: add it to the config ({f.type})")
    values = {name: _value(value, hints[name], prefix + name) for name, value in node.items()}
    try:
        return schema(**values)
    except ValueError as e:  # a range check of __post_init__: its message starts with the key's name
        raise ConfigError(f"{prefix}{e}") from None


def _value(value: Any, hint: Any, key: str) -> Any:
    """`value` checked against the type `hint` (lists become tuples, ints of float keys floats)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if is_dataclass(hint):
        return from_dict(hint, value, key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}={value!r}: must be one of {', '.join(map(str, args))}")
        return value
    if origin in (typing.Union, types.UnionType):  # `X | None`, or alternatives such as `int | Literal["auto"]`
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for alternative in inner:
            try:
                return _value(value, alternative, key)
            except ConfigError as e:
                errors.append(str(e).removeprefix(f"{key}={value!r}: "))
        raise ConfigError(f"{key}={value!r}: " + " or ".join(errors))
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}={value!r}: expected a list, e.g. {key}=[...]")
        return tuple(_value(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a group of keys")
        return {k: _value(v, args[1], f"{key}.{k}") for k, v in value.items()}
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    ok, expected = {bool: (isinstance(value, bool), "true or false"), str: (isinstance(value, str), "a string"),
                    float: (numeric, "a number"), int: (numeric and isinstance(value, int), "an integer")}[hint]
    if not ok:
        raise ConfigError(f"{key}={value!r}: expected {expected}")
    return float(value) if hint is float else value
