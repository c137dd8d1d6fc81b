"""The README's commands, run as written: a front door that fails as written is a defect.

Each ``sh`` block under a README heading is run by bash here, with ``set -e``, from the
repository root, changed only so that it can run beside other tests: pearld's endpoint becomes
an ``ipc://`` socket in the test's directory (``PEARL_ENDPOINT`` for the CLI), the gateway's
port a free one, and paths under ``/tmp/`` move into the test's directory. A heading whose
blocks no test here runs fails ``test_every_command_block_is_run``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pearl.testing.wait import poll
from tests.ports import free_base

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "docs" / "results.md").read_text()
DEFAULT_ENDPOINT = "tcp://127.0.0.1:7440"
GATEWAY = "127.0.0.1:8000"


def sections() -> dict[str, str]:
    """The README's text under each ``##`` heading (the title's part under ``PEARL``)."""
    out: dict[str, str] = {}
    title = "PEARL"
    for part in re.split(r"^(#{1,2} .+)$", README, flags=re.M):
        if re.match(r"#{1,2} ", part):
            title = part.lstrip("# ").strip()
        else:
            out[title] = out.get(title, "") + part
    return out


def blocks(section: str, lang: str = "sh") -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", sections()[section], flags=re.M | re.S)


# The headings whose sh blocks a test below runs, and the one whose block CI itself runs.
RUN_HERE = {
    "The first five minutes",
    "Running under a trainer",
    "Your own environment",
    "Your own model",
    "Agents over HTTP: the OpenAI-compatible gateway",
    "Commands",
    "PEARL",
}


def test_every_command_block_is_run() -> None:
    with_blocks = {title for title in sections() if blocks(title)}
    assert with_blocks <= RUN_HERE, f"README sh blocks no test runs: {with_blocks - RUN_HERE}"


def test_the_set_up_commands_are_the_makefiles() -> None:
    """``make test`` is what CI runs; ``make demo`` is ``pearl demo`` on the embedded default,
    the job tests/rl/test_tracker_makespan.py runs (for fewer steps)."""
    assert [ln.split("#")[0].strip() for ln in blocks("PEARL")[0].splitlines()] == [
        "make demo",
        "make test",
    ]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: .*\n\t\$\(VENV\)/bin/pearl demo --config configs/local-cpu.toml$",
                     makefile, flags=re.M)  # fmt: skip
    assert "make test" in (ROOT / ".ci" / "run").read_text()


class Shell:
    """A README block run as a bash script in its own session; whatever it leaves running
    (pearld, a watch) is stopped by its process group when the test ends."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sock_dir = Path(tempfile.mkdtemp(prefix="pearl-readme-"))  # ipc paths are short
        self.endpoint = f"ipc://{self.sock_dir}/api.sock"
        self.gateway = f"127.0.0.1:{free_base(1)}"
        self.procs: list[subprocess.Popen[str]] = []

    def script(self, block: str) -> str:
        text = block.replace("/tmp/", f"{self.tmp}/").replace(DEFAULT_ENDPOINT, self.endpoint)
        text = text.replace(GATEWAY, self.gateway)
        return text.replace("pearld --config", f"pearld --endpoint {self.endpoint} --config")

    def run(self, block: str, timeout_s: float) -> str:
        if not (ROOT / ".venv" / "bin" / "activate").is_file() and ".venv" in block:
            pytest.skip("the README's blocks activate .venv, which make test creates")
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {**os.environ, "PATH": path, "PEARL_ENDPOINT": self.endpoint}
        env["PYTHONUNBUFFERED"] = "1"
        p = subprocess.Popen(
            ["bash", "-e", "-c", self.script(block)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.procs.append(p)
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            out, _ = p.communicate()
            raise AssertionError(f"the block did not finish in {timeout_s}s:\n{out}") from None
        assert p.returncode == 0, f"the README block failed (exit {p.returncode}):\n{out}"
        return out

    def stop(self) -> None:
        """SIGTERM to each block's session (pearld etc.), SIGKILL to what is left of it after
        30 s: nothing a block started outlives the test."""
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            p.wait(timeout=60)
            if not poll(lambda g=p.pid: not group_alive(g), 30, 0.1):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(self.sock_dir, ignore_errors=True)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def shell(tmp_path: Path):  # type: ignore[no-untyped-def]
    sh = Shell(tmp_path)
    yield sh
    sh.stop()


@pytest.mark.slow
def test_the_first_five_minutes(shell: Shell) -> None:
    (block,) = blocks("The first five minutes")
    out = shell.run(block, timeout_s=180)
    watched = re.findall(r"\d\d:\d\d:\d\d seq ", out)  # its lines may interleave with others
    # the snapshot, then the 4 changes --count asked for (a resync after a gap prints its
    # snapshot too, which --count does not count)
    assert len(watched) >= 1 + 4, out
    assert "gpus-added logged" in out and "training may proceed" in out, out
    assert re.search(r"^worker\s+role\s+activity", out, flags=re.M), out  # log replay's table


def test_the_decisions_are_the_ones_shown(shell: Shell) -> None:
    """Each ``pearl decide`` line's comment starts with the split it prints."""
    (block,) = blocks("Commands")
    for line in block.splitlines():
        command, _, comment = line.partition("#")
        out = shell.run(command, timeout_s=60)
        shown = comment.split()[0].rstrip(",;")
        assert re.search(rf"^decision: \S+ {shown}, ", out, flags=re.M), (line, out)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "section", ["Running under a trainer", "Your own environment", "Your own model"]
)
def test_a_trainer_runs_as_shown(shell: Shell, section: str) -> None:
    (block,) = blocks(section)
    out = shell.run(block, timeout_s=420)
    assert re.search(r"^step \d+: reward ", out, flags=re.M), out


def test_the_examples_shown_are_the_files() -> None:
    """The README's code is the examples' code, so running the examples runs it."""
    (env,) = blocks("Your own environment", "python")
    assert env in (ROOT / "examples" / "guess_env.py").read_text()
    (loop,) = blocks("Running under a trainer", "python")
    compile(loop, "README.md", "exec")
    example = (ROOT / "examples" / "custom_training_loop.py").read_text()
    for call in ("rt.next_batch(", "rt.training(step)", "rt.publish_weights(", "rt.stop()"):
        assert call in loop and call in example, call


def test_the_headline_figures_are_recorded_in_results() -> None:
    """Every figure in the README's results table is one that docs/results.md records."""
    table = sections()["Results"]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert rows
    for row in rows:
        measured = row.split("|")[2]
        for figure in re.findall(r"[+-]?\d[\d,.]*\d(?:x|%)?|\d", measured):
            assert figure in RESULTS, f"{figure!r} ({row.split('|')[1].strip()})"


def test_readme_is_a_front_door() -> None:
    lines = README.splitlines()
    assert len(lines) <= 300
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "dates belong in docs/results.md"
    assert not re.search(r"\b[0-9a-f]{7,40}\b", README), "commit hashes belong in docs/"
    for doc in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / doc).is_file(), doc


@pytest.mark.slow
def test_an_openai_client_runs_through_the_gateway_as_shown(shell: Shell) -> None:
    (block,) = blocks("Agents over HTTP: the OpenAI-compatible gateway")
    out = shell.run(block, timeout_s=300)
    assert '"object":"list"' in out, out  # /v1/models
    assert re.search(r"^turn 2: \d+ tokens, weights version 0", out, flags=re.M), out
