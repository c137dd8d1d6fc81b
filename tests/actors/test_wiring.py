"""Actors are wired by type: every entry of a ``handles`` map is a method of its actor whose
message parameter takes that type, so a renamed or retyped handler cannot drop a message."""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pykka
import pytest

import actors
from actors import names
from actors.base import Directory, PearlActor, start


def _subclasses(cls: type[PearlActor]) -> Iterator[type[PearlActor]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _pearl_actors() -> list[type[PearlActor]]:
    """Every actor class defined under ``actors/``."""
    for module in pkgutil.iter_modules(actors.__path__):
        importlib.import_module(f"actors.{module.name}")
    found = {c for c in _subclasses(PearlActor) if c.__module__.startswith("actors.")}
    return sorted(found, key=lambda c: c.__qualname__)


ACTORS = _pearl_actors()


def _accepts(annotation: Any, msg_type: type) -> bool:
    """Whether a parameter annotated ``annotation`` takes a ``msg_type`` (``Any`` does not
    count: it says nothing about which message the method is for)."""
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    options = typing.get_args(annotation) if union else (annotation,)
    return any(isinstance(o, type) and issubclass(msg_type, o) for o in options)


def test_every_actor_is_found() -> None:
    names = {c.__name__ for c in ACTORS}
    assert {"Orchestrator", "Router", "RoleSupervisor", "WorkerActor", "ElasticScheduler"} <= names
    assert all(c.handles for c in ACTORS), [c.__name__ for c in ACTORS if not c.handles]


@pytest.mark.parametrize("actor", ACTORS, ids=lambda c: c.__name__)
def test_every_handler_is_a_method_of_its_actor_taking_its_message_type(
    actor: type[PearlActor],
) -> None:
    for msg_type, handler in actor.handles.items():
        where = f"{actor.__name__}.handles[{msg_type.__name__}]"
        assert inspect.isfunction(handler), f"{where} is not a function: {handler!r}"
        assert getattr(actor, handler.__name__, None) is handler, (
            f"{where} is {handler.__qualname__}, which is not {actor.__name__}.{handler.__name__}"
        )
        params = list(inspect.signature(handler).parameters.values())
        assert len(params) >= 2 and all(p.default is not p.empty for p in params[2:]), (
            f"{where}: {handler.__name__} must take (self, message)"
        )
        hint = typing.get_type_hints(handler).get(params[1].name)
        assert _accepts(hint, msg_type), (
            f"{where}: {handler.__name__}'s {params[1].name} is {hint}, not a {msg_type.__name__}"
        )


def test_every_actor_takes_its_name_from_the_names_module() -> None:
    constants = {v for k, v in vars(names).items() if k.isupper()}
    fixed = [c for c in ACTORS if c.name != PearlActor.name]  # a worker names itself per worker
    assert [c.__name__ for c in ACTORS if c not in fixed] == ["WorkerActor"]
    assert {c.name for c in fixed} <= constants
    assert len({c.name for c in fixed}) == len(fixed)
    assert names.worker_name(7) == "worker/7"


def test_a_handler_named_by_a_string_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match=r"Stale\.handles\[int\] must be a method"):

        class Stale(PearlActor):
            handles = {int: "on_int"}  # type: ignore[dict-item]


@dataclass(frozen=True)
class Base:
    n: int


@dataclass(frozen=True)
class Derived(Base):
    pass


class Echo(PearlActor):
    name = "echo"

    def base(self, msg: Base) -> tuple[str, int]:
        return ("base", msg.n)

    handles = {Base: base}


class EchoDerived(PearlActor):
    name = "echo-derived"

    def base(self, msg: Base) -> tuple[str, int]:
        return ("base", msg.n)

    def derived(self, msg: Derived) -> tuple[str, int]:
        return ("derived", msg.n)

    handles = {Base: base, Derived: derived}


def test_a_message_goes_to_the_handler_of_its_nearest_class(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d = Directory()
    try:
        echo, derived = start(d, Echo), start(d, EchoDerived)
        assert echo.ask(Derived(1), 5.0) == ("base", 1)  # through the MRO
        assert derived.ask(Derived(2), 5.0) == ("derived", 2)
        assert derived.ask(Base(3), 5.0) == ("base", 3)
        with caplog.at_level(logging.ERROR, logger="actors.base"):
            assert echo.ask("unknown", 5.0) is None  # logged, and the actor lives on
        assert "echo ignores a str it does not handle" in caplog.text
        assert echo.ask(Base(4), 5.0) == ("base", 4)
    finally:
        pykka.ActorRegistry.stop_all()
