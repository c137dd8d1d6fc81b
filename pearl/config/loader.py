"""A :class:`~pearl.config.Config` from a TOML file (or the defaults) and ``--set`` overrides;
every error names where the bad value came from, the file or the ``--set``."""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any

from pearl.config.coerce import build, suggest
from pearl.config.engine import MOVED
from pearl.config.files import MAX_CONFIG_BYTES, read_small_file
from pearl.config.schema import Config
from pearl.core.errors import ConfigError

Origins = dict[tuple[str, str], str]
"""``(section, dotted key)`` (``("engine", "vllm.model_path")``; ``(section, "")`` for a whole
section) -> where its value came from when not from the source, e.g. ``"--set engine.x=1"``."""


def _section_types() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config)}


def _origin(origins: Origins, source: str) -> typing.Callable[[str], str]:
    """Where the value at a dotted name came from: its own ``--set``, the ``--set`` that made
    the table it is in, else ``source``."""

    def where(name: str) -> str:
        section, _, key = name.partition(".")
        while True:
            if (section, key) in origins:
                return origins[(section, key)]
            if not key:
                return source
            key = key.rpartition(".")[0]

    return where


def from_mapping(
    data: dict[str, Any], source: str = "config", origins: Origins | None = None
) -> Config:
    """Build a validated Config from a TOML-like mapping; unknown names are errors, and so are
    the flat ``[engine]`` keys of before (:data:`~pearl.config.engine.MOVED`)."""
    sections = _section_types()
    where = _origin(origins or {}, source)
    built: dict[str, Any] = {}
    for sname, body in data.items():
        if sname not in sections:
            raise ConfigError(
                f"{where(sname)}: unknown section [{sname}]{suggest(sname, list(sections))}"
            )
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: [{sname}] must be a table")
        for key in body:
            old = f"{sname}.{key}"
            if old in MOVED:
                new = MOVED[old]
                table, _, leaf = new.rpartition(".")
                raise ConfigError(
                    f"{where(old)}: {old} moved to {new}; did you mean {new!r}? "
                    f"(in a file: {leaf} under [{table}]; on the command line: --set {new}=...)"
                )
        built[sname] = build(cls=sections[sname], body=body, path=sname, origin=where)
    return Config(**built).validate()


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` (``key`` dotted for a nested table: ``engine.vllm.model_path=m``)
    -> (section, key, value), the value read as a TOML literal (bare words are strings)."""
    path, eq, raw = text.partition("=")
    section, dot, key = path.strip().partition(".")
    if not eq or not dot or not section or not key or "" in key.split("."):
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, key, value


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a TOML file (or the defaults when ``path`` is None) and apply overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(read_small_file(p, "--config", MAX_CONFIG_BYTES))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
    origins: Origins = {}  # a typo in --set is not the file's
    for text in overrides:
        section, key, value = parse_override(text)
        here = f"--set {text.strip()}"
        *tables, leaf = [section, *key.split(".")]
        table: dict[str, Any] = data
        for depth, name in enumerate(tables):
            if name not in table:
                table[name] = {}
                origins[(section, ".".join(tables[1 : depth + 1]))] = here
            if not isinstance(table[name], dict):
                shown = ".".join(tables[: depth + 1])
                raise ConfigError(f"--set {text!r}: {shown} is not a section")
            table = table[name]
        table[leaf] = value
        origins[(section, key)] = here
    return from_mapping(data, source, origins)


__all__ = ["from_mapping", "load", "parse_override"]
