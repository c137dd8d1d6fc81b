"""Frozen, typed records and their single msgpack-ready mapping.

Every record and message type is a ``msgspec`` Struct registered under a kind (its tag).
``to_wire`` turns an instance into one plain mapping ``{"kind": K, "v": SCHEMA_VERSION, field:
value, ...}`` (enums as their values, nested values as mappings, tuples as arrays);
``Registry.decode`` checks the kind and the schema version, and msgspec checks the type of every
field, before the instance is built, so malformed input raises :class:`SchemaError` and never a
``TypeError`` deep inside the caller.

- :class:`WireStruct`: registered kinds (log records, transport and actor messages, controller
  commands). msgspec encodes them and decodes msgpack straight into them, validating every field
  in C (:meth:`Registry.msgpack_decoder`: one tagged union over a registry's kinds); this is the
  replay hot path.
- :class:`Value`: nested value types (the table's workers and steps, engine requests and
  results, profiles, views), encoded as a mapping without kind.

The bytes are one plain mapping per record, whatever wrote it: a log keeps reading the same as
the code changes (tests/log/test_old_format.py holds the format fixed).
"""

from __future__ import annotations

import typing
from typing import Any, ClassVar, Literal, TypeVar

import msgspec

from pearl.core.errors import SchemaError

SCHEMA_VERSION = 1

T = TypeVar("T")
W = TypeVar("W", bound="WireStruct")


class Value(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Base of nested value types decoded by msgspec (encoded as a mapping without kind)."""


class WireStruct(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind", kw_only=True
):
    """Base of registered msgspec records: ``class X(WireStruct, tag="x")`` + ``REG.add(X)``.

    The tag is the kind; ``v`` (keyword-only, last) is the schema version every mapping carries.
    """

    KIND: ClassVar[str]
    v: Literal[1] = 1


assert SCHEMA_VERSION == 1, "WireStruct.v's Literal must follow SCHEMA_VERSION"


class Registry:
    """A namespace of kinds: one for log records, another for wire messages."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.kinds: dict[str, type[WireStruct]] = {}
        self._decoder: msgspec.msgpack.Decoder[Any] | None = None
        self._list_decoder: msgspec.msgpack.Decoder[Any] | None = None

    def add(self, cls: type[W]) -> type[W]:
        """Register a :class:`WireStruct` subclass under its tag (also a class decorator)."""
        kind = cls.__struct_config__.tag
        if not isinstance(kind, str):
            raise TypeError(f"{cls.__name__}: a WireStruct needs a str tag (its kind)")
        if kind in self.kinds:
            raise ValueError(f"{self.name} kind {kind!r} registered twice")
        cls.KIND = kind
        self.kinds[kind] = cls
        self._decoder = self._list_decoder = None
        return cls

    def msgpack_decoder(self) -> msgspec.msgpack.Decoder[Any]:
        """One msgspec decoder of msgpack bytes into any of this registry's WireStruct kinds.

        It validates like :meth:`decode` (kind, version, field types, unknown fields), except that
        a mapping without ``v`` reads as version 1. Errors are ``msgspec`` errors.
        """
        if self._decoder is None:
            self._decoder = msgspec.msgpack.Decoder(self._union())
        return self._decoder

    def msgpack_list_decoder(self) -> msgspec.msgpack.Decoder[Any]:
        """Like :meth:`msgpack_decoder`, for a msgpack array of records (one call decodes many)."""
        if self._list_decoder is None:
            self._list_decoder = msgspec.msgpack.Decoder(list[self._union()])  # type: ignore[misc]
        return self._list_decoder

    def _union(self) -> object:
        if not self.kinds:
            raise TypeError(f"{self.name}: no kinds registered")
        return typing.Union[tuple(self.kinds.values())]  # noqa: UP007

    def decode(self, mapping: object) -> WireStruct:
        """Build the registered instance a wire mapping describes; raise SchemaError otherwise."""
        if not isinstance(mapping, dict):
            raise SchemaError(f"{self.name}: expected a mapping, got {type(mapping).__name__}")
        kind = mapping.get("kind")
        cls = self.kinds.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise SchemaError(f"unknown {self.name} kind {kind!r}; known: {sorted(self.kinds)}")
        version = mapping.get("v")
        if version != SCHEMA_VERSION:
            raise SchemaError(
                f"{self.name} {kind!r} has schema version {version!r}, this PEARL reads "
                f"version {SCHEMA_VERSION}; upgrade PEARL or convert the data"
            )
        return _convert(mapping, cls)


def to_wire(obj: object) -> dict[str, Any]:
    """The single mapping of a registered record: kind, schema version and fields."""
    if not isinstance(obj, WireStruct):
        raise TypeError(f"{type(obj).__name__} is not a registered record (a WireStruct)")
    out: dict[str, Any] = {"kind": obj.KIND, "v": SCHEMA_VERSION}
    out.update(_struct_plain(obj))
    return out


def to_plain(obj: object) -> dict[str, Any]:
    """The mapping of a struct or record without kind and version (for JSON views)."""
    if not isinstance(obj, msgspec.Struct):
        raise TypeError(f"{type(obj).__name__} is not a record or value (a msgspec Struct)")
    return _struct_plain(obj)


def from_plain(cls: type[T], mapping: object) -> T:
    """Decode a struct from its plain mapping."""
    if not isinstance(mapping, dict):
        raise SchemaError(f"{cls.__name__}: expected a mapping, got {type(mapping).__name__}")
    if issubclass(cls, WireStruct):
        return _convert({**mapping, "kind": cls.KIND}, cls)
    if not issubclass(cls, msgspec.Struct):
        raise TypeError(f"{cls.__name__} is not a record or value (a msgspec Struct)")
    return _convert(mapping, cls)


def _struct_plain(obj: msgspec.Struct) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(obj)
    if isinstance(obj, WireStruct):
        del out["kind"], out["v"]
    return out


def _convert(mapping: object, cls: type[T]) -> T:
    try:
        return msgspec.convert(mapping, cls)
    except msgspec.ValidationError as e:
        raise SchemaError(f"{cls.__name__}: {e}") from None


__all__ = [
    "SCHEMA_VERSION",
    "Registry",
    "Value",
    "WireStruct",
    "from_plain",
    "to_plain",
    "to_wire",
]
