"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pykka
import pytest


@pytest.fixture(autouse=True)
def _stop_all_actors(request: pytest.FixtureRequest) -> Iterator[None]:
    """No test leaks a running pykka actor (or its thread) into the next one, except within a
    module marked ``shared_actors`` (its module fixture stops them)."""
    yield
    if request.node.get_closest_marker("shared_actors") is None:
        pykka.ActorRegistry.stop_all(timeout=10)
