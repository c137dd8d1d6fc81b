"""Fixtures for the gateway's tests: a scripted backend, the app over it, a TestClient."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pearl.gateway.app import build_app
from tests.gateway.scripted import ScriptedBackend


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
