"""Calls that pass more than three positional arguments to the project's own functions and types.

Issue 42: a call of more than three arguments names them. A call counts when its callee's name
(``f(...)``, ``obj.f(...)``) is a function, method or class defined in the project and it passes
more than ``--max`` (3) plain positional arguments (``*args`` forwarding is not counted). Names
are matched, not resolved, so a method named like a project function counts too.

    python scripts/positional_calls.py              # the count, by directory
    python scripts/positional_calls.py --list       # every call, as path:line name (n)
    python scripts/positional_calls.py --check      # exit 1 if any is left
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

ROOTS = ("pearl", "actors", "transports", "tests", "benchmarks", "examples", "scripts")


class Site(NamedTuple):
    path: Path
    line: int
    name: str
    positional: int


def _files(root: Path) -> list[Path]:
    out: list[Path] = []
    for r in ROOTS:
        out.extend(p for p in sorted((root / r).rglob("*.py")) if ".venv" not in p.parts)
    return out


def _defined(trees: dict[Path, ast.Module]) -> set[str]:
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
    names.discard("__init__")
    return names


def _callee(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def sites(root: Path) -> list[Site]:
    """Every call of a project name with more than three plain positional arguments."""
    trees = {p: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in _files(root)}
    defined = _defined(trees)
    out: list[Site] = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _callee(node)
            n = sum(not isinstance(a, ast.Starred) for a in node.args)
            if name in defined and n > LIMIT:
                out.append(Site(path=path.relative_to(root), line=node.lineno, name=name, positional=n))
    return sorted(out)


LIMIT = 3


def main(argv: list[str] | None = None) -> int:
    global LIMIT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print every call")
    ap.add_argument("--check", action="store_true", help="exit 1 if any call is left")
    ap.add_argument("--max", type=int, default=3, help="positional arguments allowed (3)")
    a = ap.parse_args(argv)
    LIMIT = a.max
    found = sites(Path(__file__).resolve().parent.parent)
    if a.list:
        for s in found:
            print(f"{s.path}:{s.line} {s.name} ({s.positional})")
    by_dir = Counter(s.path.parts[0] for s in found)
    print(f"{len(found)} calls with more than {LIMIT} positional arguments", end="")
    print(": " + ", ".join(f"{d} {n}" for d, n in sorted(by_dir.items())) if by_dir else "")
    return 1 if a.check and found else 0


if __name__ == "__main__":
    sys.exit(main())
