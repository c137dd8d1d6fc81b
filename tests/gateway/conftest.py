"""Fixtures for the gateway's tests: a scripted backend, the app over it, a TestClient."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import pearl
from pearl.gateway.app import build_app
from tests.gateway.scripted import ScriptedBackend

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def local_runtime(tmp_path: Path, sets: Sequence[str]) -> Iterator[Any]:
    """An embedded Runtime on configs/local-cpu.toml with ``sets``, stopped on the way out."""
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / "local-cpu.toml", state_dir=tmp_path / "state", overrides=sets
    )
    try:
        rt.start()
        yield rt
    finally:
        rt.stop()


@pytest.fixture
def backend() -> ScriptedBackend:
    return ScriptedBackend()


@pytest.fixture
def client(backend: ScriptedBackend) -> Iterator[TestClient]:
    # Server exceptions re-raise in the test: an exception escaping the app fails it.
    with TestClient(build_app(backend)) as c:
        yield c


def sse(text: str) -> list[Any]:
    """A server-sent-events body -> its events' JSON payloads, "[DONE]" kept as the string."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out
