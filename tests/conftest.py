"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pykka
import pytest


@pytest.fixture(autouse=True)
def _stop_all_actors() -> Iterator[None]:
    """No test leaks a running pykka actor (or its thread) into the next one."""
    yield
    pykka.ActorRegistry.stop_all(timeout=10)
