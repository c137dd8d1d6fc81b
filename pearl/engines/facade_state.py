"""State of the SGLang-compatible facade (:mod:`pearl.engines.facade`): bootstrap rooms and
the cumulative counters its ``/metrics`` reports."""

from __future__ import annotations

import threading
import time

from pearl.engines.base import EngineTelemetry


class Rooms:
    """Prefill side: which decode KV inbox joined which bootstrap room. Thread-safe."""

    def __init__(self, ttl_s: float = 300.0) -> None:
        self.ttl_s = ttl_s
        self._cv = threading.Condition()
        self._rooms: dict[int, tuple[str, float]] = {}

    def register(self, room: int, kv_address: str) -> None:
        with self._cv:
            now = time.monotonic()
            for r in [r for r, (_, t) in self._rooms.items() if now - t > self.ttl_s]:
                del self._rooms[r]
            self._rooms[room] = (kv_address, now)
            self._cv.notify_all()

    def wait(self, room: int, timeout_s: float) -> str | None:
        """The decode inbox of ``room`` (consumed), or None when nobody joined in time."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while room not in self._rooms:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(min(left, 0.5))
            return self._rooms.pop(room)[0]


class Counters:
    """SGLang's metric names, accumulated from the torch engine's telemetry."""

    def __init__(self) -> None:
        self.v: dict[str, float] = {
            name: 0.0
            for name in (
                "sglang:prompt_tokens_total",
                "sglang:generation_tokens_total",
                "sglang:inter_token_latency_seconds_sum",
                "sglang:inter_token_latency_seconds_count",
                "sglang:time_to_first_token_seconds_sum",
                "sglang:time_to_first_token_seconds_count",
                "sglang:kv_transfer_latency_ms_sum",
                "sglang:kv_transfer_latency_ms_count",
                "sglang:kv_transfer_speed_gb_s_sum",
                "sglang:kv_transfer_speed_gb_s_count",
            )
        }
        self._lock = threading.Lock()

    def add(self, t: EngineTelemetry) -> None:
        with self._lock:
            v = self.v
            for it in t.iterations:
                v["sglang:prompt_tokens_total"] += it.prefill_tokens
                v["sglang:generation_tokens_total"] += it.decode_batch
                if it.decode_batch and not it.prefill_tokens:  # each token waited one iteration
                    v["sglang:inter_token_latency_seconds_sum"] += it.duration_s * it.decode_batch
                    v["sglang:inter_token_latency_seconds_count"] += it.decode_batch
                elif it.prefill_tokens and not it.decode_batch:
                    v["sglang:time_to_first_token_seconds_sum"] += it.duration_s
                    v["sglang:time_to_first_token_seconds_count"] += 1
            for x in t.transfers:
                if x.duration_s > 0:
                    v["sglang:kv_transfer_latency_ms_sum"] += x.duration_s * 1e3
                    v["sglang:kv_transfer_latency_ms_count"] += 1
                    v["sglang:kv_transfer_speed_gb_s_sum"] += x.bytes / x.duration_s / 1e9
                    v["sglang:kv_transfer_speed_gb_s_count"] += 1

    def values(self, running: int) -> dict[str, float]:
        with self._lock:
            return dict(self.v, **{"sglang:num_running_reqs": float(running)})


__all__ = ["Counters", "Rooms"]
