"""transports may import only pearl.core from the rest of PEARL (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import transports

ROOT = Path(transports.__file__).parent
MODULES = sorted(p.stem for p in ROOT.glob("*.py"))


@pytest.mark.parametrize("name", MODULES)
def test_imports_only_pearl_core(name: str) -> None:
    tree = ast.parse((ROOT / f"{name}.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    project = {m for m in imported if m.split(".")[0] in ("pearl", "actors")}
    bad = {m for m in project if not m.startswith("pearl.core")}
    assert not bad, f"transports/{name}.py imports {sorted(bad)}"
    assert "pickle" not in {m.split(".")[0] for m in imported}
