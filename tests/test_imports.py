"""The dependency rules of docs/architecture.md, checked on every module's imports (its AST, so
an import inside a function counts as much as one at the top).

The layers, innermost first:

- ``pearl.core``: imports nothing of the project outside ``pearl.core``, and of the rest only the
  standard library, numpy and msgspec (``tests/core/test_purity.py`` rules out I/O);
- ``transports``: the project's ``pearl.core`` only;
- the library (``pearl``, ``actors``, ``transports``): never the applications, the test support
  (``pearl.testing``), the tests or the benchmarks;
- the applications (the CLI, ``pearl.__main__``, the demo with its learning run and report):
  the library, never the tests or the benchmarks;
- ``pearl.testing``, shared by tests and benchmarks: the library, never the tests or the
  benchmarks; the benchmarks and the examples never import the tests.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("pearl", "actors", "transports", "tests", "benchmarks")
# The application layer: the demo app is a package (pearl/demo/) or flat modules beside it.
APPS = ("pearl.cli", "pearl.__main__", "pearl.demo", "pearl.learning", "pearl.report")
TESTING = ("pearl.testing",)
CORE_THIRD_PARTY = {"numpy", "msgspec"}


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved to absolute names."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            out.add(mod)
            # `from pearl import demo` imports the module pearl.demo
            out |= {f"{mod}.{a.name}" for a in node.names if a.name != "*"}
    return out


def violations(name: str, imported: set[str]) -> list[str]:
    """The imports of module ``name`` that break a rule, each with the rule it breaks."""
    bad = []
    project = {m for m in imported if m.split(".")[0] in PROJECT}
    if under(name, ("pearl.core",)):
        for m in sorted(project):
            if not under(m, ("pearl.core",)):
                bad.append(f"{m}: pearl.core imports only pearl.core")
        for m in sorted(imported - project):
            top = m.split(".")[0]
            if top and top not in sys.stdlib_module_names and top not in CORE_THIRD_PARTY:
                bad.append(f"{m}: pearl.core imports the stdlib, numpy and msgspec only")
    if under(name, ("transports",)):
        for m in sorted(project):
            if not under(m, ("pearl.core", "transports")):
                bad.append(f"{m}: transports imports only pearl.core")
    if not under(name, ("tests",)):
        for m in sorted(project):
            if under(m, ("tests",)):
                bad.append(f"{m}: only tests import tests")
    if not under(name, ("benchmarks",)):
        for m in sorted(project):
            if under(m, ("benchmarks",)):
                bad.append(f"{m}: only benchmarks import benchmarks")
    library = under(name, ("pearl", "actors", "transports")) and not under(name, APPS + TESTING)
    if library:
        for m in sorted(project):
            if under(m, APPS):
                bad.append(f"{m}: the library does not import the applications")
            if under(m, TESTING):
                bad.append(f"{m}: the library does not import the test support")
    return bad


def modules() -> list[Path]:
    dirs = ("pearl", "actors", "transports", "benchmarks", "examples")
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_dependency_rules(path: Path) -> None:
    bad = violations(module_name(path), imports(path))
    assert not bad, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize(
    ("name", "imported", "broken"),
    [
        ("pearl.core.plan", {"pearl.log"}, "pearl.core imports only pearl.core"),
        ("pearl.core.plan", {"zmq"}, "pearl.core imports the stdlib"),
        ("transports.rpc", {"actors.messages"}, "transports imports only pearl.core"),
        ("pearl.sim.fromlog", {"pearl.cli.log"}, "the library does not import the applications"),
        ("pearl.daemon", {"pearl.demo.report"}, "the library does not import the applications"),
        ("actors.router", {"pearl.testing"}, "the library does not import the test support"),
        ("benchmarks.bench_log", {"tests.log.workload"}, "only tests import tests"),
        ("pearl.cli.demo", {"benchmarks.live_pearld"}, "only benchmarks import benchmarks"),
    ],
)
def test_each_rule_catches_its_break(name: str, imported: set[str], broken: str) -> None:
    assert any(broken in v for v in violations(name, imported))


@pytest.mark.parametrize(
    ("name", "imported"),
    [
        ("pearl.core.plan", {"pearl.core.state", "numpy", "typing"}),
        ("pearl.cli.demo", {"pearl.demo.report", "pearl.runtime", "transports.rpc"}),
        ("pearl.demo.app", {"pearl.demo.report", "actors.router"}),
        ("pearl.testing.harness", {"pearl.runtime", "transports.rpc"}),
        ("benchmarks.bench_log", {"pearl.testing.workload", "benchmarks.live_pearld"}),
    ],
)
def test_allowed_imports_pass(name: str, imported: set[str]) -> None:
    assert violations(name, imported) == []
