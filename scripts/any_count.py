"""Count ``Any`` annotations in the library (issue 42, target: ``Any`` annotations ≤ 120).

An *annotation* is a parameter's (``*args``/``**kwargs`` included), a return's, or an annotated
assignment's (``x: T = ...``, class fields). It is *exact* when it is ``Any`` alone
(``typing.Any``, ``"Any"``), and *mentions* ``Any`` when ``Any`` appears anywhere in it
(``dict[str, Any]``, ``Callable[..., Any]``, ``"Any | None"``); every exact one also mentions.
A *JSON* one is a mapping of ``str`` to ``Any`` (``dict``/``Mapping``/``MutableMapping``), the
shape of an arbitrary JSON object; the count is reported apart because those may stay.

    python scripts/any_count.py                  # totals, then per module (most first)
    python scripts/any_count.py -v               # every annotation, file:line: source
    python scripts/any_count.py pearl/daemon.py  # other roots (default: pearl actors transports)
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOTS = ("pearl", "actors", "transports")
JSON_MAPPINGS = frozenset({"dict", "Dict", "Mapping", "MutableMapping"})


class Hit(NamedTuple):
    path: Path
    line: int
    source: str
    exact: bool
    json: bool


def _parse_string(node: ast.expr) -> ast.expr:
    """A string annotation (``"Any | None"``) parsed to its expression; others unchanged."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return node
    return node


def _is_any(node: ast.expr) -> bool:
    node = _parse_string(node)
    if isinstance(node, ast.Name):
        return node.id == "Any"
    return isinstance(node, ast.Attribute) and node.attr == "Any"


def _mentions(node: ast.expr) -> bool:
    node = _parse_string(node)
    for sub in ast.walk(node):
        if isinstance(sub, ast.expr) and sub is not node and _mentions_one(sub):
            return True
    return _is_any(node)


def _mentions_one(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _mentions(node)
    return _is_any(node)


def _is_json(node: ast.expr) -> bool:
    """``dict[str, Any]`` / ``Mapping[str, Any]`` (optionally ``| None``)."""
    node = _parse_string(node)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        none = [s for s in sides if isinstance(s, ast.Constant) and s.value is None]
        rest = [s for s in sides if s not in none]
        return len(none) == 1 and _is_json(rest[0])
    if not isinstance(node, ast.Subscript):
        return False
    base = node.value
    name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
    if name not in JSON_MAPPINGS or not isinstance(node.slice, ast.Tuple):
        return False
    key, value = (node.slice.elts + [None, None])[:2]
    return isinstance(key, ast.Name) and key.id == "str" and value is not None and _is_any(value)


def _annotations(tree: ast.Module) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            every += [a for a in (args.vararg, args.kwarg) if a is not None]
            yield from (a.annotation for a in every if a.annotation is not None)
            if node.returns is not None:
                yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation


def scan(path: Path) -> list[Hit]:
    """Every annotation in ``path`` that mentions ``Any``."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    hits = []
    for ann in _annotations(tree):
        if _mentions(ann):
            source = ast.get_source_segment(text, ann) or ast.unparse(ann)
            hits.append(Hit(path, ann.lineno, source, _is_any(ann), _is_json(ann)))
    return sorted(hits, key=lambda h: h.line)


def _files(roots: list[str]) -> Iterator[Path]:
    for root in map(Path, roots):
        yield from [root] if root.is_file() else sorted(root.rglob("*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", default=list(ROOTS))
    parser.add_argument("-v", "--verbose", action="store_true", help="list every annotation")
    args = parser.parse_args(argv)
    per: dict[Path, list[Hit]] = {p: scan(p) for p in _files(args.roots)}
    hits = [h for found in per.values() for h in found]
    exact = sum(h.exact for h in hits)
    json = sum(h.json for h in hits)
    print(f"exact Any: {exact}  mentioning Any: {len(hits)}  of which str->Any mappings: {json}")
    print(f"{'exact':>6} {'mention':>7} {'json':>5}  module")
    ranked = sorted(per.items(), key=lambda kv: (-sum(h.exact for h in kv[1]), -len(kv[1])))
    for path, found in ranked:
        if found:
            n_exact, n_json = sum(h.exact for h in found), sum(h.json for h in found)
            print(f"{n_exact:>6} {len(found):>7} {n_json:>5}  {path}")
    if args.verbose:
        for h in hits:
            kind = "exact" if h.exact else "json" if h.json else "mention"
            print(f"{h.path}:{h.line}: [{kind}] {h.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
