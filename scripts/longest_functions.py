"""The longest functions and the largest modules in the library (issue 42's targets).

A function's length is its ``def`` line to its last line (decorators excluded; nested
functions are counted on their own and inside their parent). Modules over the size
convention (about 400 lines, CONVENTIONS.md §10) are listed with their line counts.

    python scripts/longest_functions.py             # the 10 longest, then modules over 400
    python scripts/longest_functions.py -n 20       # the 20 longest
    python scripts/longest_functions.py --max 120   # exit 1 if any function is longer
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import NamedTuple

ROOTS = ("pearl", "actors", "transports")
MODULE_LIMIT = 400


class Function(NamedTuple):
    lines: int
    path: Path
    line: int
    name: str


def _functions(path: Path, tree: ast.Module) -> list[Function]:
    """Every function in one module, named by its enclosing classes and functions."""
    found: list[Function] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                found.append(
                    Function(lines=end - child.lineno + 1, path=path, line=child.lineno, name=name)
                )
                walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def _sources(root: Path) -> list[Path]:
    return sorted(p for r in ROOTS for p in (root / r).rglob("*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="how many functions to list")
    parser.add_argument("--max", type=int, default=None, help="fail if any function is longer")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)

    functions: list[Function] = []
    big_modules: list[tuple[int, Path]] = []
    for path in _sources(args.root):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(args.root)
        functions += _functions(rel, ast.parse(text, filename=str(rel)))
        count = len(text.splitlines())
        if count > MODULE_LIMIT:
            big_modules.append((count, rel))

    functions.sort(key=lambda f: (-f.lines, str(f.path), f.line))
    print(f"longest functions in {', '.join(ROOTS)} (def line to last line):")
    for f in functions[: args.n]:
        print(f"{f.lines:6d}  {f.path}:{f.line}  {f.name}")
    print(f"\nmodules over {MODULE_LIMIT} lines:")
    for count, rel in sorted(big_modules, key=lambda m: (-m[0], str(m[1]))):
        print(f"{count:6d}  {rel}")
    if not big_modules:
        print("  (none)")

    if args.max is not None and functions and functions[0].lines > args.max:
        print(
            f"\n{functions[0].name} is {functions[0].lines} lines, over {args.max}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
