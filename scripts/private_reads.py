"""Count reads of private attributes in the tests (issue 42, item 8).

A *private read* is an ``ast.Attribute`` in load context whose name starts with one underscore
(``obj._ready``, ``router._pick(...)``), not a dunder, on an object that is not the test
module's own helper: ``self._x`` / ``cls._x`` inside a class the test module defines is
excluded, as is any name that a class in the same module assigns as ``self._name`` (the
module's own helper state). Stores (``obj._x = ...``, monkeypatching) are counted apart.

    python scripts/private_reads.py            # total, then a count per file
    python scripts/private_reads.py -v         # every read, file:line: source
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple


class Hit(NamedTuple):
    path: Path
    line: int
    attr: str
    store: bool


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_names(tree: ast.Module) -> set[str]:
    """Private names the module's own classes assign on ``self`` or declare in their body."""
    own: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                own.add(node.attr)
            elif isinstance(node, ast.FunctionDef) and node in cls.body:
                own.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node in cls.body:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                own.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in own if _private(n)}


def _in_own_class(tree: ast.Module) -> set[int]:
    """ids of ``self._x``/``cls._x`` nodes lexically inside a class of this module."""
    inside: set[int] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                inside.add(id(node))
    return inside


def scan(path: Path) -> list[Hit]:
    """Every private attribute access in one test file that is not the file's own."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own, inside = _own_names(tree), _in_own_class(tree)
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        if id(node) in inside or node.attr in own:
            continue
        hits.append(
            Hit(path=path, line=node.lineno, attr=node.attr, store=isinstance(node.ctx, ast.Store))
        )
    return sorted(hits)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="tests", type=Path)
    ap.add_argument("-v", "--verbose", action="store_true", help="list every read")
    args = ap.parse_args(argv)
    hits = [h for p in sorted(args.root.rglob("*.py")) for h in scan(p)]
    reads = [h for h in hits if not h.store]
    stores = [h for h in hits if h.store]
    print(f"private attribute reads in {args.root}/: {len(reads)} (stores: {len(stores)})")
    if args.verbose:
        for h in reads:
            src = h.path.read_text().splitlines()[h.line - 1].strip()
            print(f"  {h.path}:{h.line}: .{h.attr}  {src[:90]}")
    else:
        for path, n in Counter(h.path for h in reads).most_common():
            print(f"  {n:4d}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
