"""What an in-process engine's model side provides to the shared serving loop, and its knobs.

The loop (:mod:`pearl.engines.in_process`) schedules; a backend computes. All hooks run on the
engine thread (``_backend_start`` and ``_free_device`` at stop also run on the caller's).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from pearl.engines.sequence import Sample, Segment, Seq


@dataclass(frozen=True)
class ServingConfig:
    """Scheduler knobs shared by every in-process engine."""

    kv_budget_bytes: int = 64 << 20  # KV pool size: pages = budget // (page_size * bytes/token)
    page_size: int = 16  # tokens per KV page
    token_budget: int = 256  # tokens per iteration: decode first, prefill chunks fill the rest
    max_running: int = 256  # sequences batched at once
    kv_timeout_s: float = 30.0  # decode role: how long to wait for a prefill worker's KV
    max_seq_len: int = 0  # context limit; 0 means the model's own
    telemetry_cap: int = 100_000  # stats kept between two telemetry() calls
    call_timeout_s: float = 600.0  # a release/resume/load/set_role call waits this long


class ModelBackend(ABC):
    """The model side of an engine: K/V storage, the forward pass, weights and device memory."""

    @abstractmethod
    def _bytes_per_token(self) -> int:
        """K/V bytes one token occupies (all layers)."""

    @abstractmethod
    def _context_limit(self) -> int:
        """The model's maximum sequence length."""

    @abstractmethod
    def _backend_start(self) -> None:
        """Build the model; allocate nothing the KV pool needs yet (``_allocate_kv`` does)."""

    @abstractmethod
    def _allocate_kv(self, n_pages: int) -> None:
        """Allocate K/V storage for ``n_pages`` pages of ``cfg.page_size`` tokens."""

    @abstractmethod
    def _forward(self, segments: list[Segment]) -> list[Sample]:
        """Compute K/V of every segment; one :class:`Sample` per segment with ``samples``."""

    @abstractmethod
    def _copy_kv(self, source: Seq, target: Seq, n: int) -> None:
        """K/V of ``source``'s first ``n`` positions into ``target``'s pages (a sample of a
        group, n > 1, takes its leader's prefill)."""

    @abstractmethod
    def _export_kv(self, seq: Seq) -> tuple[dict[str, Any], list[Any]]:
        """Meta and buffers of ``seq``'s K/V for ``tokens[:computed]``."""

    @abstractmethod
    def _import_kv(self, seq: Seq, meta: dict[str, Any], frames: list[Any]) -> None:
        """Write received K/V into ``seq.pages``."""

    @abstractmethod
    def _free_device(self) -> None:
        """Drop weights and K/V storage (release_memory)."""

    @abstractmethod
    def _restore_device(self) -> None:
        """Bring the weights back at the current version (resume_memory)."""

    @abstractmethod
    def _load(self, version: int, source: Any) -> None:
        """Load new weights into the live model."""

    def _new_sequence(self, seq: Seq) -> None:
        """Per-sequence backend state (e.g. a seeded sampling generator); none by default."""
        return None

    def _now(self) -> float:
        """The clock telemetry is stamped with."""
        return time.monotonic()

    def _after_idle(self) -> None:
        """Called when the loop wakes from an idle wait; nothing by default."""
        return None


__all__ = ["ModelBackend", "ServingConfig"]
