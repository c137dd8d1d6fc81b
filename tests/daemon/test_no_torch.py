"""pearld on the sim engine, gateway on, never imports torch or transformers: its start is the
control plane's (issue 42: 12.9 s cold when the tokenizer lived in the torch engine)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from pearl.testing.pearld import ROOT, free_port

pytestmark = pytest.mark.slow

# Runs pearld's own main() with a thread that waits for the gateway's /v1/models, writes which of
# torch and transformers are in sys.modules, and stops pearld as SIGTERM does.
PROBE = """
import os, signal, sys, threading, time, urllib.request
from pearl import daemon

out, port, argv = sys.argv[1], sys.argv[2], sys.argv[3:]

def probe():
    answered, deadline = False, time.monotonic() + 60
    while not answered and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as r:
                answered = r.status == 200
        except OSError:
            time.sleep(0.05)
    heavy = [m for m in ("torch", "transformers") if m in sys.modules]
    with open(out, "w") as f:
        f.write(f"answered={answered} heavy={','.join(heavy) or 'none'}")
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=probe, daemon=True).start()
sys.exit(daemon.main(argv))
"""


@pytest.mark.parametrize(
    ("config", "sets"),
    [
        ("configs/sim-32.toml", []),
        # the embedded default on the sim engine: its Pipeline Scheduler builds prompts too
        ("configs/local-cpu.toml", ["engine.kind=sim", "engine.sim.time_scale=0.001"]),
    ],
    ids=["sim-32", "local-cpu-sim"],
)
def test_pearld_serves_the_gateway_without_torch(
    tmp_path: Path, config: str, sets: list[str]
) -> None:
    port, out = free_port(), tmp_path / "modules"
    argv = ["--config", config, "--state-dir", str(tmp_path / "state")]
    argv += [
        "--endpoint",
        f"ipc://{tmp_path}/api.sock",
        "--set",
        f"gateway.listen=127.0.0.1:{port}",
    ]
    argv += [a for s in sets for a in ("--set", s)]
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), str(port), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.exists(), run.stderr[-3000:]
    assert out.read_text() == "answered=True heavy=none", run.stderr[-3000:]


def test_the_torch_package_imports_torch_for_the_fork_server() -> None:
    """The other side: the fork server preloads ``pearl.engines.torch`` so that torch hosts fork
    with torch imported. A package that loaded its names lazily (c7dc16c) preloaded nothing, and
    each host paid the import itself, about 3.5 CPU-s on these cores (scripts/fork_torch.py):
    the README's trainer loop ran 4x slower. Checked on the source, without importing torch."""
    package = ROOT / "pearl" / "engines" / "torch"
    init = ast.parse((package / "__init__.py").read_text())
    top = {n.module for n in init.body if isinstance(n, ast.ImportFrom)}
    assert "pearl.engines.torch.engine" in top
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in init.body)
    engine = ast.parse((package / "engine.py").read_text())
    assert any(
        isinstance(n, ast.Import) and any(a.name == "torch" for a in n.names) for n in engine.body
    )
