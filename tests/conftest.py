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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``), a module's tests run on one worker, so its
    module fixtures start once; the vLLM modules share one group, as they share one server."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = "vllm" if path.startswith("tests/engines/vllm/") else path
        item.add_marker(pytest.mark.xdist_group(group))
