"""pearl.core is pure: no threads, sockets, sleeps, clocks or files, nothing of the project
outside pearl.core (docs/architecture.md). Time is an argument."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pearl.core

ROOT = Path(pearl.core.__file__).parent
MODULES = sorted(p.stem for p in ROOT.glob("*.py"))
IMPURE = {
    "threading",
    "socket",
    "time",
    "os",
    "subprocess",
    "asyncio",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "signal",
    "multiprocessing",
    "zmq",
    "pykka",
    "select",
    "random",
}


@pytest.mark.parametrize("name", MODULES)
def test_core_module_is_pure(name: str) -> None:
    tree = ast.parse((ROOT / f"{name}.py").read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("open", "print", "input"), f"{name}.py calls {node.func.id}"
    roots = {m.split(".")[0] for m in imported}
    assert not roots & IMPURE, f"pearl/core/{name}.py imports {sorted(roots & IMPURE)}"
    project = {m for m in imported if m.split(".")[0] in ("pearl", "actors", "transports")}
    bad = {m for m in project if not m.startswith("pearl.core")}
    assert not bad, f"pearl/core/{name}.py imports {sorted(bad)}"
