"""Fixtures of the engine tests: ``engines`` runs a test once per engine kind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import FACTORIES, Engines


@pytest.fixture(params=sorted(FACTORIES))
def engines(request: pytest.FixtureRequest) -> Iterator[Engines]:
    es = Engines(request.param)
    yield es
    es.close()
