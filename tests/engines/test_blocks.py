"""KV page bookkeeping: no page is ever lost or owned twice, whatever the order of operations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.engines.base import EngineError
from pearl.engines.blocks import KVBlocks, common_prefix, pages_for


def test_budget_is_cut_into_pages() -> None:
    b = KVBlocks(budget_bytes=10_000, bytes_per_token=100, page_size=16)
    assert b.n_pages == 6 and b.free_pages == 6 and b.used_bytes == 0
    with pytest.raises(EngineError, match="at least"):
        KVBlocks(budget_bytes=100, bytes_per_token=100, page_size=16)


def test_prefix_is_claimed_once_and_keeps_at_least_one_token_to_prefill() -> None:
    b = KVBlocks(budget_bytes=4 * 10, bytes_per_token=1, page_size=4)  # 10 pages
    pages = b.allocate(3)
    assert pages is not None
    b.keep_prefix("t", list(range(10)), pages)  # 10 tokens -> 3 pages
    assert b.cached_pages == 3
    reuse, got = b.take_prefix("t", list(range(10)))
    assert reuse == 9 and len(got) == 3  # the last prompt token is recomputed for its logits
    assert b.take_prefix("t", list(range(10))) == (0, [])
    b.keep_prefix("t", list(range(10)), got)
    reuse, got = b.take_prefix("t", [0, 1, 2, 3, 4, 99])
    assert reuse == 5 and len(got) == 2 and b.free_pages == 8


ops = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "free", "keep", "take", "clear"]),
        st.integers(0, 5),
        st.integers(0, 40),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_pages_are_conserved(program: list[tuple[str, int, int]]) -> None:
    b = KVBlocks(budget_bytes=4 * 20, bytes_per_token=1, page_size=4)
    owned: list[list[int]] = []
    for op, traj, n in program:
        if op == "alloc":
            got = b.allocate(n % 8)
            if got is not None:
                owned.append(got)
        elif op == "free" and owned:
            b.release(owned.pop())
        elif op == "keep" and owned:
            pages = owned.pop()
            b.keep_prefix(f"t{traj}", list(range(min(n, 4 * len(pages)))), pages)
        elif op == "take":
            _, got = b.take_prefix(f"t{traj}", list(range(n + 1)))
            owned.append(got)
        elif op == "clear":
            b.clear_prefixes()
        held = [p for ps in owned for p in ps]
        assert len(held) == len(set(held))
        assert len(held) + b.cached_pages + b.free_pages == b.n_pages


def test_helpers() -> None:
    assert pages_for(0, 16) == 0 and pages_for(16, 16) == 1 and pages_for(17, 16) == 2
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


def test_a_large_pool_starts_at_once_and_never_hands_a_page_out_twice() -> None:
    """Never-used pages are not listed up front (a list of millions held the interpreter for
    ~0.7 s at every engine start); handed-back pages are reused first; no page is out twice."""
    import random
    import time

    t0 = time.perf_counter()
    kv = KVBlocks(budget_bytes=64 << 30, bytes_per_token=1024, page_size=1)  # 64M pages
    assert time.perf_counter() - t0 < 0.2  # listing 64M pages took seconds
    assert kv.free_pages == kv.n_pages == 64 << 20 and kv.used_bytes == 0
    rng = random.Random(0)
    held: list[list[int]] = []
    out: set[int] = set()
    peak = ever = 0
    for _ in range(2000):
        if held and rng.random() < 0.45:
            pages = held.pop(rng.randrange(len(held)))
            out.difference_update(pages)
            kv.release(pages)
        else:
            got = kv.allocate(rng.randint(0, 40))
            assert got is not None and not out & set(got) and len(set(got)) == len(got)
            out.update(got)
            held.append(got)
            ever = max(ever, *got) if got else ever
        peak = max(peak, len(out))
        assert kv.free_pages == kv.n_pages - len(out)
    assert ever < peak  # handed-back pages are reused first: no more pages touched than needed
