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


# The longest test files, longest first. ``make test`` runs two pytest-xdist lanes a file at a
# time (``--dist loadfile --no-loadscope-reorder``): the long ones start first and the many short
# ones fill in after, so that both lanes end together (longest-processing-time-first), instead of
# one lane running a long file alone at the end. Order only: a file missing here runs after
# these, in collection order.
LONGEST_FIRST = (
    "tests/test_benchmarks.py",
    "tests/engines/vllm/test_vllm_pearl.py",
    "tests/test_readme.py",
    "tests/daemon/test_notice.py",
    "tests/daemon/test_chaos.py",
    "tests/engines/vllm/test_vllm_engine.py",
    "tests/engines/vllm/test_vllm_pearld.py",
    "tests/daemon/test_ray.py",
    "tests/daemon/test_pearld.py",
    "tests/rl/test_pd_switch.py",
    "tests/daemon/test_startup.py",
    "tests/daemon/test_soak.py",
    "tests/engines/sglang/test_engine.py",
    "tests/integrations/test_trl.py",
    "tests/rl/test_rl_run.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    late = len(rank)
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], late))  # stable
