"""An instance of every registered kind, built from its fields (msgspec Structs) and type hints."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

import msgspec

import actors.messages  # noqa: F401  (registers the actors' kinds: every registry is whole)
from pearl.core.events import GpusAdded
from transports.codec import REGISTRIES
from transports.protocol import Event

OVERRIDES: dict[type, Any] = {Event: Event.of(GpusAdded(gpus=(4, 5)))}


def sample_value(tp: Any, depth: int = 0) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return [1, "two", {"three": 3.0}]  # lists, not tuples: what msgpack gives back
    if origin in (typing.Union, types.UnionType):
        return sample_value(next(a for a in args if a is not type(None)), depth)
    if tp is bool:
        return True
    if tp is int:
        return 7 + depth
    if tp is float:
        return 0.25
    if tp is str:
        return "sample-\u00e9"
    if tp is bytes:
        return b"\x00\xffbin"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return list(tp)[-1]
    if origin is tuple:
        return (sample_value(args[0], depth + 1), sample_value(args[0], depth + 2))
    if origin is dict:
        return {sample_value(args[0], depth + 1): sample_value(args[1], depth + 1)}
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return sample(tp, depth + 1)
    raise TypeError(f"no sample for {tp!r}")


def sample(cls: type, depth: int = 0) -> Any:
    if cls in OVERRIDES:
        return OVERRIDES[cls]
    hints = typing.get_type_hints(cls)
    names = [f.name for f in msgspec.structs.fields(cls) if f.name != "v"]
    kwargs = {name: sample_value(hints[name], depth) for name in names}
    return cls(**kwargs)


def all_kinds() -> list[tuple[str, str, type]]:
    return [(reg.name, kind, cls) for reg in REGISTRIES for kind, cls in sorted(reg.kinds.items())]
