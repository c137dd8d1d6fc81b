"""KV memory bookkeeping shared by every engine: pages under a byte budget, and trajectory prefixes.

The KV cache is cut into pages of ``page_size`` tokens. A running sequence owns a list of pages;
when a request of a trajectory finishes, its pages stay resident in the :class:`PrefixCache` under
the trajectory's name so the next turn prefills only its new tokens. Resident prefixes are evicted
least-recently-used first whenever a running sequence needs pages. Pure bookkeeping: the torch
engine maps page ids to slices of its K/V tensors, the sim engine only counts them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from pearl.engines.base import EngineError


def pages_for(tokens: int, page_size: int) -> int:
    """Pages needed to hold ``tokens`` tokens."""
    return -(-tokens // page_size)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class CachedPrefix:
    tokens: tuple[int, ...]  # tokens whose K/V the pages hold, in order
    pages: list[int]


class KVBlocks:
    """A fixed pool of pages plus the LRU cache of trajectory prefixes that lives in it."""

    def __init__(self, budget_bytes: int, bytes_per_token: int, page_size: int) -> None:
        if page_size < 1 or bytes_per_token < 1:
            raise EngineError(
                f"page_size and bytes_per_token must be >= 1, got {page_size}, {bytes_per_token}"
            )
        self.page_size = page_size
        self.bytes_per_page = page_size * bytes_per_token
        self.n_pages = budget_bytes // self.bytes_per_page
        if self.n_pages < 2:
            raise EngineError(
                f"KV budget of {budget_bytes} bytes holds {self.n_pages} pages of {page_size} "
                f"tokens ({self.bytes_per_page} bytes each); give at least "
                f"{2 * self.bytes_per_page} bytes"
            )
        # Free pages: those handed back (``_free``) and those never handed out (``_fresh`` up to
        # ``n_pages``, not listed: a list of every page of a large pool took ~0.7 s holding the
        # interpreter at start, long enough for the host's heartbeats to stop).
        self._free: list[int] = []
        self._fresh = 0
        self._cache: OrderedDict[str, CachedPrefix] = OrderedDict()
        self.evictions = 0

    @property
    def free_pages(self) -> int:
        return len(self._free) + self.n_pages - self._fresh

    @property
    def cached_pages(self) -> int:
        return sum(len(c.pages) for c in self._cache.values())

    @property
    def used_bytes(self) -> int:
        """Bytes held by running sequences and resident prefixes."""
        return (self.n_pages - self.free_pages) * self.bytes_per_page

    def allocate(self, n: int) -> list[int] | None:
        """``n`` pages, evicting resident prefixes LRU-first if needed; None if it cannot fit."""
        if n > self.free_pages + self.cached_pages:
            return None
        while self.free_pages < n:
            _, victim = self._cache.popitem(last=False)
            self._free.extend(victim.pages)
            self.evictions += 1
        reused = min(n, len(self._free))  # handed-back pages first, then never-used ones
        out = self._free[len(self._free) - reused :] if reused else []
        del self._free[len(self._free) - reused :]
        fresh = n - reused
        if fresh:
            out.extend(range(self._fresh, self._fresh + fresh))
            self._fresh += fresh
        return out

    def release(self, pages: Sequence[int]) -> None:
        self._free.extend(pages)

    def take_prefix(self, trajectory: str, prompt: Sequence[int]) -> tuple[int, list[int]]:
        """Claim a trajectory's resident prefix for ``prompt``: (reused tokens, their pages).

        At least one prompt token is left to prefill (its logits give the first output token);
        pages past the reused tokens go back to the pool.
        """
        entry = self._cache.pop(trajectory, None) if trajectory else None
        if entry is None:
            return 0, []
        reuse = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
        keep = pages_for(reuse, self.page_size)
        self._free.extend(entry.pages[keep:])
        return reuse, entry.pages[:keep]

    def keep_prefix(self, trajectory: str, tokens: Sequence[int], pages: list[int]) -> None:
        """Keep a finished sequence's pages resident as its trajectory's prefix (most recent)."""
        old = self._cache.pop(trajectory, None)
        if old is not None:
            self._free.extend(old.pages)
        need = pages_for(len(tokens), self.page_size)
        self._free.extend(pages[need:])
        if need:
            self._cache[trajectory] = CachedPrefix(tuple(tokens), pages[:need])

    def clear_prefixes(self) -> None:
        """Forget every resident prefix (their K/V is stale after a weight update)."""
        for entry in self._cache.values():
            self._free.extend(entry.pages)
        self._cache.clear()


__all__ = ["CachedPrefix", "KVBlocks", "common_prefix", "pages_for"]
