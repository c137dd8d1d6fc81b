"""Fixtures of the RL tests: a started tiny torch engine, and a check that no sandbox leaks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pearl.engines.torch import TorchEngine
from pearl.rl.envs.sandbox import CHILD


@pytest.fixture
def engine() -> Iterator[TorchEngine]:
    e = TorchEngine(preset="tiny", seed=0)
    e.start()
    yield e
    e.stop()


def sandbox_children() -> list[int]:
    """Pids of this process's children that run the sandbox script (zombies included)."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and (CHILD.encode() in cmd or " Z " in stat.rsplit(")", 1)[1][:3]):
            out.append(int(d.name))
    return out


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Fails the test when a sandbox process (running or zombie) outlives it."""
    before = set(sandbox_children())
    yield
    left = set(sandbox_children()) - before
    assert not left, f"sandbox processes left behind: {sorted(left)}"
