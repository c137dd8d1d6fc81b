"""Helpers for tests of state machines given as transition tables."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Set
from typing import TypeVar

S = TypeVar("S", bound=Hashable)


def reachable(table: Mapping[S, Set[S]], start: S) -> set[S]:
    """Every state reachable from ``start`` (itself included)."""
    seen, todo = {start}, [start]
    while todo:
        for nxt in table[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
