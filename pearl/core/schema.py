"""Frozen, typed records and their single msgpack-ready mapping.

Every record and message type is registered under a kind. ``to_wire`` turns an instance into one
plain mapping ``{"kind": K, "v": SCHEMA_VERSION, field: value, ...}`` (enums as their values,
nested structs as mappings, tuples as arrays); ``Registry.decode`` checks the kind, the schema
version and the type of every field before building the instance, so malformed input raises
:class:`SchemaError` and never a ``TypeError`` deep inside the caller.

Two kinds of types share that one mapping:

- :class:`WireStruct` / :class:`Value`: ``msgspec`` Structs (log records and the table's value
  types). msgspec encodes them and decodes msgpack straight into them, validating every field in
  C (:meth:`Registry.msgpack_decoder`: one tagged union over a registry's kinds); this is the
  replay hot path. Their bytes are the same mapping the hand-written converter below writes, so
  logs of either codec read the same.
- frozen slotted dataclasses (``@registered`` / ``@struct``: transport messages, commands, engine
  and RL values), converted by the per-class converters below, built once from the type hints.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeVar

import msgspec

from pearl.core.errors import SchemaError

SCHEMA_VERSION = 1

T = TypeVar("T")
W = TypeVar("W", bound="WireStruct")
_Conv = Callable[[Any], Any]


class Value(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Base of nested value types decoded by msgspec (encoded as a mapping without kind)."""


class WireStruct(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind",
                 kw_only=True):
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
        self.kinds: dict[str, type] = {}
        self._decoder: msgspec.msgpack.Decoder[Any] | None = None

    def add(self, cls: type[W]) -> type[W]:
        """Register a :class:`WireStruct` subclass under its tag (also a class decorator)."""
        kind = cls.__struct_config__.tag
        if not isinstance(kind, str):
            raise TypeError(f"{cls.__name__}: a WireStruct needs a str tag (its kind)")
        if kind in self.kinds:
            raise ValueError(f"{self.name} kind {kind!r} registered twice")
        cls.KIND = kind
        self.kinds[kind] = cls
        self._decoder = None
        return cls

    def msgpack_decoder(self) -> msgspec.msgpack.Decoder[Any]:
        """One msgspec decoder of msgpack bytes into any of this registry's WireStruct kinds.

        It validates like :meth:`decode` (kind, version, field types, unknown fields), except that
        a mapping without ``v`` reads as version 1. Errors are ``msgspec`` errors.
        """
        if self._decoder is None:
            structs = [c for c in self.kinds.values() if issubclass(c, WireStruct)]
            if not structs:
                raise TypeError(f"{self.name}: no WireStruct kinds registered")
            self._decoder = msgspec.msgpack.Decoder(typing.Union[tuple(structs)])  # noqa: UP007
        return self._decoder

    def register(self, kind: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: make ``cls`` a frozen slotted dataclass known under ``kind``."""

        def wrap(cls: type[T]) -> type[T]:
            if kind in self.kinds:
                raise ValueError(f"{self.name} kind {kind!r} registered twice")
            dc = _frozen(cls)
            dc.KIND = kind  # type: ignore[attr-defined]
            self.kinds[kind] = dc
            return dc

        return wrap

    def decode(self, mapping: Any) -> Any:
        """Build the registered instance a wire mapping describes; raise SchemaError otherwise."""
        if not isinstance(mapping, dict):
            raise SchemaError(f"{self.name}: expected a mapping, got {type(mapping).__name__}")
        kind = mapping.get("kind")
        cls = self.kinds.get(kind)  # type: ignore[arg-type]
        if cls is None:
            raise SchemaError(f"unknown {self.name} kind {kind!r}; known: {sorted(self.kinds)}")
        version = mapping.get("v")
        if version != SCHEMA_VERSION:
            raise SchemaError(
                f"{self.name} {kind!r} has schema version {version!r}, this PEARL reads "
                f"version {SCHEMA_VERSION}; upgrade PEARL or convert the data"
            )
        if issubclass(cls, msgspec.Struct):
            return _convert(mapping, cls)
        return _codec(cls).decode(mapping, skip=("kind", "v"))


@typing.dataclass_transform(frozen_default=True)
def registered(registry: Registry, kind: str) -> Callable[[type[T]], type[T]]:
    """Class decorator: ``@registered(RECORDS, "gpus-added")`` (what type checkers understand
    as making a frozen dataclass; ``registry.register(kind)`` does the same)."""
    return registry.register(kind)


@typing.dataclass_transform(frozen_default=True)
def struct(cls: type[T]) -> type[T]:
    """Class decorator for nested value types (encoded as a mapping without kind)."""
    return _frozen(cls)


def _frozen(cls: type[T]) -> type[T]:
    return dataclasses.dataclass(frozen=True, slots=True)(cls)


def to_wire(obj: Any) -> dict[str, Any]:
    """The single mapping of a registered record: kind, schema version and fields."""
    if isinstance(obj, msgspec.Struct):
        out: dict[str, Any] = {"kind": obj.KIND, "v": SCHEMA_VERSION}  # type: ignore[attr-defined]
        out.update(_struct_plain(obj))
        return out
    out = {"kind": obj.KIND, "v": SCHEMA_VERSION}
    out.update(_codec(type(obj)).encode(obj))
    return out


def to_plain(obj: Any) -> dict[str, Any]:
    """The mapping of a struct or record without kind and version (for JSON views)."""
    if isinstance(obj, msgspec.Struct):
        return _struct_plain(obj)
    return _codec(type(obj)).encode(obj)


def from_plain(cls: type[T], mapping: Any) -> T:
    """Decode a struct from its plain mapping."""
    if not isinstance(mapping, dict):
        raise SchemaError(f"{cls.__name__}: expected a mapping, got {type(mapping).__name__}")
    if issubclass(cls, WireStruct):
        return _convert({**mapping, "kind": cls.KIND}, cls)
    if issubclass(cls, msgspec.Struct):
        return _convert(mapping, cls)
    return _codec(cls).decode(mapping)


def _struct_plain(obj: msgspec.Struct) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(obj)
    if isinstance(obj, WireStruct):
        del out["kind"], out["v"]
    return out


def _convert(mapping: Any, cls: type[T]) -> T:
    try:
        return msgspec.convert(mapping, cls)
    except msgspec.ValidationError as e:
        raise SchemaError(f"{cls.__name__}: {e}") from None


class _Codec:
    def __init__(self, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.fields: list[tuple[str, _Conv, _Conv, bool]] = []
        for f in dataclasses.fields(cls):
            enc, dec = _converters(hints[f.name], f"{cls.__name__}.{f.name}")
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            self.fields.append((f.name, enc, dec, required))
        self.names = frozenset(f[0] for f in self.fields)
        # Fast path, same results and errors: when every field is present and nothing else is,
        # a value whose type is exactly its field's scalar type is taken as is, anything else
        # goes through the field's decoder (which raises what the checked path would), and the
        # instance is built positionally. Otherwise the checked path below runs.
        self.plan = tuple((name, _exact(hints[name]), dec) for name, _, dec, _ in self.fields)
        self.positional = all(f.init and not f.kw_only for f in dataclasses.fields(cls))

    def encode(self, obj: Any) -> dict[str, Any]:
        return {name: enc(getattr(obj, name)) for name, enc, _, _ in self.fields}

    def decode(self, m: dict[str, Any], skip: tuple[str, ...] = ()) -> Any:
        if self.positional and len(m) == len(self.plan) + len(skip):
            values = []
            for name, exact, dec in self.plan:
                if name not in m:
                    break
                v = m[name]
                values.append(v if type(v) is exact else dec(v))
            else:
                return self.cls(*values)
        return self.decode_checked(m, skip)

    def decode_checked(self, m: dict[str, Any], skip: tuple[str, ...] = ()) -> Any:
        kwargs = {}
        for name, _, dec, required in self.fields:
            if name in m:
                kwargs[name] = dec(m[name])
            elif required:
                raise SchemaError(f"{self.cls.__name__}: missing field {name!r}")
        if len(m) - len(skip) > len(kwargs):
            extra = sorted(set(m) - self.names - set(skip), key=str)
            if extra:
                raise SchemaError(f"{self.cls.__name__}: unknown field(s) {extra}")
        return self.cls(**kwargs)


_CODECS: dict[type, _Codec] = {}


def _codec(cls: type) -> _Codec:
    c = _CODECS.get(cls)
    if c is None:
        c = _CODECS[cls] = _Codec(cls)
    return c


def _ident(v: Any) -> Any:
    return v


def _exact(tp: Any) -> type | None:
    """The scalar type whose values decode as themselves under annotation ``tp`` (or None)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _exact(inner[0]) if len(inner) == 1 else None
    return tp if tp in (bool, int, str, bytes, float) else None


def _converters(tp: Any, where: str) -> tuple[_Conv, _Conv]:
    """Encoder and checking decoder for one annotated type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return _ident, _ident
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"{where}: only Optional[X] unions are supported")
        enc, dec = _converters(inner[0], where)
        return (lambda v: None if v is None else enc(v)), (lambda v: None if v is None else dec(v))
    if tp is bool:
        return _ident, _checker(lambda v: type(v) is bool, "bool", where)
    if tp is int:
        return _ident, _checker(lambda v: type(v) is int, "int", where)
    if tp is str:
        return _ident, _checker(lambda v: type(v) is str, "str", where)
    if tp is bytes:
        return _ident, _checker(lambda v: type(v) is bytes, "bytes", where)
    if tp is float:

        def dec_float(v: Any) -> float:
            if type(v) is float:
                return v
            if type(v) is int:
                return float(v)
            raise SchemaError(f"{where}: expected float, got {type(v).__name__}")

        return _ident, dec_float
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [m.value for m in tp]
        by_value = tp._value2member_map_  # what tp(v) looks up first

        def dec_enum(v: Any) -> Any:
            try:
                return by_value[v]
            except (KeyError, TypeError):
                pass
            try:
                return tp(v)
            except ValueError:
                raise SchemaError(f"{where}: {v!r} is not one of {values}") from None

        return (lambda v: v.value), dec_enum
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            ienc, idec = _converters(args[0], where + "[]")
            if ienc is _ident:
                enc_t: _Conv = _ident
            else:

                def enc_t(v: Any) -> Any:
                    return tuple(ienc(x) for x in v)

            exact = _exact(args[0])

            def dec_t(v: Any) -> tuple[Any, ...]:
                if type(v) not in (list, tuple):
                    raise SchemaError(f"{where}: expected an array, got {type(v).__name__}")
                if exact is not None:
                    t = tuple(v)
                    if not t or set(map(type, t)) == {exact}:
                        return t
                return tuple(idec(x) for x in v)

            return enc_t, dec_t
        raise TypeError(f"{where}: use tuple[X, ...]")
    if origin is dict:
        kenc, kdec = _converters(args[0], where + ".key")
        venc, vdec = _converters(args[1], where + ".value")

        def dec_d(v: Any) -> dict[Any, Any]:
            if not isinstance(v, dict):
                raise SchemaError(f"{where}: expected a mapping, got {type(v).__name__}")
            return {kdec(k): vdec(x) for k, x in v.items()}

        return (lambda v: {kenc(k): venc(x) for k, x in v.items()}), dec_d
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return (lambda v: _codec(tp).encode(v)), (lambda v: from_plain(tp, v))
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _struct_plain, (lambda v: from_plain(tp, v))
    raise TypeError(f"{where}: unsupported field type {tp!r}")


def _checker(ok: Callable[[Any], bool], name: str, where: str) -> _Conv:
    def dec(v: Any) -> Any:
        if ok(v):
            return v
        raise SchemaError(f"{where}: expected {name}, got {type(v).__name__} {v!r:.40}")

    return dec


__all__ = [
    "SCHEMA_VERSION",
    "Registry",
    "Value",
    "WireStruct",
    "from_plain",
    "registered",
    "struct",
    "to_plain",
    "to_wire",
]
