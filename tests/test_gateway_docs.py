"""docs/gateway.md's examples, run as written against a live pearld started as the doc says.

Every ``sh`` and ``python`` block of docs/gateway.md runs, in the doc's order, as one bash
script from the repository root: an ``sh`` block as it is, a ``python`` block as
``python - <<'EOF'`` at its place, so it sees what the blocks before it exported (``KEY``). A
block that is not meant to run (an output sample) has the line ``<!-- not run -->`` right above
its fence; blocks in other languages (``json``) never run. As in tests/test_readme.py, the
script is changed only so that it can run beside other tests: the gateway's port becomes a free
one, pearld's endpoint an ``ipc://`` socket, and paths under ``/tmp/`` move into the test's
directory.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pearl.config.loader import load as load_config
from pearl.gateway.pool import served_model
from tests.test_readme import Shell

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "gateway.md"
NOT_RUN = "<!-- not run -->"
FENCE = re.compile(
    r"^(?P<mark><!-- not run -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S
)


def blocks(text: str) -> list[tuple[str, str, bool]]:
    """Each fenced block of ``text``: (language, body, whether it runs)."""
    out = []
    for m in FENCE.finditer(text):
        lang = m["lang"]
        out.append((lang, m["body"], lang in ("sh", "python") and not m["mark"]))
    return out


def script(text: str) -> str:
    """The blocks that run, as one bash script."""
    parts = []
    for lang, body, runs in blocks(text):
        if not runs:
            continue
        if lang == "python":
            assert "PEARL_DOC_PY" not in body
            body = f"python - <<'PEARL_DOC_PY'\n{body}PEARL_DOC_PY\n"
        parts.append(body)
    return "\n".join(parts)


def test_the_blocks_that_run_are_the_docs_commands_and_programs() -> None:
    text = DOC.read_text()
    found = blocks(text)
    assert sum(runs for _, _, runs in found) >= 5
    assert text.count("```") == 2 * len(found), "a fence the parser did not see"
    for lang, body, runs in found:
        if runs and lang == "python":
            compile(body, "docs/gateway.md", "exec")
    assert "pearld --config configs/local-cpu.toml" in script(text)


def test_the_doc_names_the_model_the_readmes_pearld_serves() -> None:
    """The examples' model is the one pearld on configs/local-cpu.toml serves (its preset's)."""
    served = served_model(load_config(ROOT / "configs" / "local-cpu.toml"))
    named = set(re.findall(r'"model": "([^"]+)"|model="([^"]+)"', DOC.read_text()))
    assert {a or b for a, b in named} == {served}


@pytest.fixture
def shell(tmp_path: Path):  # type: ignore[no-untyped-def]
    sh = Shell(tmp_path)
    yield sh
    sh.stop()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_docs_examples_run_against_a_live_pearld(shell: Shell) -> None:
    out = shell.run(script(DOC.read_text()), timeout_s=480)
    assert '"id":"tiny"' in out, out  # /v1/models
    assert '"object":"chat.completion"' in out, out
    assert '"output_ids":' in out, out  # /generate
    assert '"count":' in out and '"max_model_len":1024' in out, out  # /tokenize
    assert '{"prompt":"Hi"}' in out, out  # /detokenize
    assert "[0, 1] " in out, out  # completions: one choice per prompt
    assert '"kind":"training-begin"' in out and '"kind":"training-finished"' in out, out
