"""Values from TOML or ``--set`` into a section's typed fields: choices into enum members, GPU
lists into id tuples, nested tables into their sections; every mismatch one ConfigError line."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pearl.config.gpus import GpuList, parse_gpus
from pearl.core.errors import ConfigError

T = TypeVar("T")
E = TypeVar("E", bound=enum.StrEnum)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

FIX = "set a number (a TOML float such as 0.5, or an int)"


def suggest(name: str, options: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest option, else the valid ones."""
    close = difflib.get_close_matches(name, options, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid: {', '.join(sorted(options))}"


def is_section(tp: object) -> bool:
    """A field whose type is itself a section: a nested table such as ``[engine.vllm]``."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def member(tp: type[E], value: object, where: str) -> E:
    """``value`` as a member of ``tp``: the string a TOML file or ``--set`` gives, or a member."""
    if isinstance(value, tp):
        return value
    options = [m.value for m in tp]
    if isinstance(value, str) and value in options:
        return tp(value)
    raise ConfigError(
        f"{where} = {value!r}; expected one of {', '.join(options)}{suggest(str(value), options)}"
    )


def parse_fields(section: DataclassInstance, name: str) -> None:
    """Turn a section's enum fields, given as strings, into their members, and its nested
    tables, given as mappings, into their sections (the section is frozen: a direct
    ``EngineConfig(kind="torch")`` or a JSON copy sent to a worker host is parsed here too)."""
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        tp, value = hints[f.name], getattr(section, f.name)
        if isinstance(tp, type) and issubclass(tp, enum.StrEnum):
            object.__setattr__(section, f.name, member(tp, value, f"{name}.{f.name}"))
        elif is_section(tp) and isinstance(value, Mapping):
            object.__setattr__(section, f.name, tp(**value))


def coerce(value: object, tp: object, where: str) -> Any:
    """``value`` as a field of type ``tp``; ``where`` starts the error's line."""
    optional = [a for a in typing.get_args(tp) if a is not type(None)]
    if isinstance(tp, types.UnionType) and len(optional) == 1:
        tp = optional[0]  # `float | None`: TOML has no null, so a given value is the type
    if tp is GpuList or tp == GpuList:
        return parse_gpus(value, where)
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and args[-1:] == (Ellipsis,) and is_section(args[0]):
        # an array of tables: [[cluster.nodes]]
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise ConfigError(f"{where}: expected an array of tables ([[...]])")
        return tuple(_item(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if typing.get_origin(tp) is tuple and args == (str, Ellipsis):  # a list of strings
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return tuple(v.strip() for v in items if v.strip())
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{where}: expected a finite number, got {value!r}; {FIX}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif isinstance(tp, type) and issubclass(tp, enum.StrEnum):
        return member(tp, value, where)
    else:
        raise ConfigError(f"{where}: unsupported type {tp}")
    raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")


def _item(cls: type[DataclassInstance], body: dict[str, Any], where: str) -> object:
    """One table of an array of tables."""
    hints = typing.get_type_hints(cls)
    keys = [f.name for f in dataclasses.fields(cls)]
    for key in body:
        if key not in hints:
            raise ConfigError(f"{where}: unknown key {key}{suggest(key, keys)}")
    return cls(**{k: coerce(v, hints[k], f"{where}.{k}") for k, v in body.items()})


def build(cls: type[T], body: Mapping[str, Any], path: str, origin: Callable[[str], str]) -> T:
    """The section ``cls`` at ``path`` (``engine``, ``engine.vllm``) from a TOML table, nested
    tables built the same way; ``origin(key)`` names where the dotted key's value came from."""
    hints = typing.get_type_hints(cls)
    keys = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in body.items():
        name = f"{path}.{key}"
        if key not in hints:
            raise ConfigError(f"{origin(name)}: unknown key {name}{suggest(key, keys)}")
        tp = hints[key]
        if is_section(tp):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{origin(name)}: {name} is a table; write [{name}] and its keys, or "
                    f"--set {name}.KEY=VALUE"
                )
            kwargs[key] = build(cls=tp, body=value, path=name, origin=origin)
        else:
            kwargs[key] = coerce(value, tp, f"{origin(name)}: {name}")
    return cls(**kwargs)


__all__ = ["FIX", "build", "coerce", "is_section", "member", "parse_fields", "suggest"]
