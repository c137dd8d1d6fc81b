"""The configuration reference, docs/configuration.md, rendered from the schema in pearl.config.

Each table has a section; a nested table (``[engine.vllm]``) has its own, after its parent's.

A key's type and default come from its dataclass field, its description from the docstring
under the field (a field without one is an error, so a new key cannot go undocumented).
``python -m pearl.config_reference`` rewrites the file; ``--check`` exits 1 when it differs, and
tests/test_config_reference.py does the same.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import inspect
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from pearl import config as C

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

HEADER = """\
# Configuration reference

<!-- Generated from pearl/config/ by `python -m pearl.config_reference`; do not edit. -->

pearld, `pearl` and the embedded `Runtime` read one TOML file (`--config FILE`; the defaults
below when none is given) and then `--set section.key=value` overrides, whose value is read as a
TOML literal (a bare word is a string). An unknown section or key, or a value of the wrong type
or outside its choices, is an error that names where it came from and the closest valid name.
GPU lists take an array of ids or a range string such as `"0-15"` or `"16-19,24"`. Each
engine's keys are in its own table under `[engine]`: `[engine.vllm]` in a file,
`--set engine.vllm.port=31000` on the command line.
`configs/` holds ready-made files: the CPU demo, the simulator at paper scale, SGLang, vLLM.
"""


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right under it), whitespace folded."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, after in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = markdown(after.value.value)
    return docs


def markdown(doc: str) -> str:
    """A docstring's text on one line, its ``literals`` in Markdown's single backticks."""
    return " ".join(doc.split()).replace("``", "`")


def type_text(tp: object) -> str:
    """How a field's type reads in the table."""
    if tp == C.GpuList:
        return "GPU ids"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in tp)
    if isinstance(tp, types.UnionType):
        (inner,) = (a for a in typing.get_args(tp) if a is not type(None))
        return f"{type_text(inner)}, optional"
    if typing.get_origin(tp) is tuple and dataclasses.is_dataclass(typing.get_args(tp)[0]):
        return "array of tables"
    if typing.get_origin(tp) is tuple and typing.get_args(tp) == (str, Ellipsis):
        return "list of strings"
    names: dict[object, str] = {bool: "bool", int: "int", float: "float", str: "string"}
    return names[tp]


def default_text(value: Any, tp: object) -> str:
    """A field's default as it would be written in TOML."""
    if value is None:
        return "unset"
    if tp == C.GpuList:
        return f'`"{C.format_gpus(value)}"`' if value else "`[]`"
    if isinstance(value, tuple):
        return "`[]`" if not value else f"`{list(value)}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def rows(cls: type, prefix: str) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of each field of ``cls``, nested tables expanded."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out: list[tuple[str, str, str, str]] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}"
        if f.name not in docs:
            raise ValueError(f"{key} has no docstring: add one under the field in pearl/config/")
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            continue  # a nested table: a section of its own (tables)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        out.append((key, type_text(tp), default_text(default, tp), docs[f.name]))
        item = (typing.get_args(tp) or (None,))[0]
        if (
            typing.get_origin(tp) is tuple
            and isinstance(item, type)
            and dataclasses.is_dataclass(item)
        ):
            out += rows(item, f"{key}[]")
    return out


def tables(cls: type, name: str) -> list[tuple[str, type]]:
    """(name, section) of ``cls`` at ``name`` and of its nested tables, parents first."""
    out = [(name, cls)]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += tables(tp, f"{name}.{f.name}")
    return out


def reference() -> str:
    """The whole of docs/configuration.md."""
    parts = [HEADER]
    hints = typing.get_type_hints(C.Config)
    for section in dataclasses.fields(C.Config):
        for name, cls in tables(hints[section.name], section.name):
            doc = (inspect.getdoc(cls) or "").split("\n\n")
            summary = "\n\n".join(markdown(p) for p in doc)
            summary = summary.removeprefix(f"`[{name}]`: ")
            summary = summary[:1].upper() + summary[1:]
            parts.append(f"\n## [{name}]\n\n{summary}\n\n")
            parts.append("| key | type | default | description |\n|---|---|---|---|\n")
            parts += [f"| `{k}` | {t} | {d} | {doc} |\n" for k, t, d, doc in rows(cls, name)]
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pearl.config_reference", description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    ap.add_argument("path", nargs="?", type=Path, default=DOC)
    a = ap.parse_args(argv)
    text = reference()
    if a.check:
        current = a.path.read_text() if a.path.exists() else ""
        if current != text:
            print(f"{a.path} is out of date: run python -m pearl.config_reference", file=sys.stderr)
            return 1
        return 0
    a.path.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["field_docs", "main", "reference", "tables"]
