"""Fixtures for transport tests: a fresh ZeroMQ context per test that must terminate cleanly
(a socket left open makes ``term()`` hang, which fails the test), short ipc paths, and a check
that every transport thread was joined."""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

_THREAD_PREFIXES = ("rpc-", "pub-", "sub")


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    before = {t for t in threading.enumerate() if t.name.startswith(_THREAD_PREFIXES)}
    c: zmq.Context[Any] = zmq.Context()
    yield c
    done = threading.Event()

    def term() -> None:
        c.term()
        done.set()

    threading.Thread(target=term, daemon=True).start()
    assert done.wait(5.0), "zmq context did not terminate: a socket was left open"
    left = {t for t in threading.enumerate() if t.name.startswith(_THREAD_PREFIXES)} - before
    assert not left, f"threads not joined: {sorted(t.name for t in left)}"


@pytest.fixture
def ipc() -> Iterator[Callable[[], str]]:
    """Factory of fresh ipc:// endpoints in a short directory (socket paths max ~100 bytes)."""
    d = tempfile.mkdtemp(prefix="pt-", dir="/tmp")
    n = itertools.count()
    yield lambda: f"ipc://{d}/s{next(n)}"
    shutil.rmtree(d, ignore_errors=True)
