"""Engine telemetry from a server's Prometheus ``/metrics``: deltas between two scrapes.

A server (SGLang, vLLM) does not report its scheduler iterations one by one, so each scrape
window becomes at most one representative stat of each kind, what the Runtime Tracker fits from:

- decode: mean inter-token latency as the iteration time, at the running batch size (the
  server's running-requests gauge, else tokens x latency / window);
- prefill: mean time to first token less mean queueing time, over the mean prompt tokens of the
  requests that got their first token in the window;
- KV transfers (where the server measures them): mean latency at the mean speed.

:class:`MetricNames` says which series a server calls what.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pearl.core.state import Role
from pearl.engines.base import EngineTelemetry, IterationStat, KVTransferStat


@dataclass(frozen=True)
class MetricNames:
    itl: tuple[str, ...]  # inter-token latency histograms, the first one served wins
    ttft: str  # time to first token (histogram)
    queue: str  # time queued before scheduling (histogram)
    running: str  # requests running now (gauge)
    prompt_tokens: str  # prompt tokens processed (counter)
    kv_latency_ms: str = ""  # KV transfer latency in ms (histogram); "": not measured
    kv_speed: str = ""  # KV transfer speed in GB/s (histogram)


class MetricsDelta:
    """Remembers the previous scrape; :meth:`update` returns the stats of the window since."""

    def __init__(self, names: MetricNames) -> None:
        self.names = names
        self.prev: dict[str, float] = {}
        self.t_prev = time.monotonic()

    def reset(self, metrics: dict[str, float]) -> None:
        self.prev, self.t_prev = dict(metrics), time.monotonic()

    def update(self, metrics: dict[str, float], role: Role) -> EngineTelemetry:
        if not metrics:
            return EngineTelemetry()
        now = time.monotonic()
        window = max(now - self.t_prev, 1e-6)
        prev, self.prev, self.t_prev = self.prev, dict(metrics), now

        def d(name: str) -> float:
            return max(metrics.get(name, 0.0) - prev.get(name, 0.0), 0.0)

        def mean(hist: str) -> tuple[float, float]:
            n = d(hist + "_count")
            return (d(hist + "_sum") / n if n else 0.0), n

        names = self.names
        iters: list[IterationStat] = []
        itl, n_tok = next(((m, n) for m, n in (mean(h) for h in names.itl) if n), (0.0, 0.0))
        if itl > 0:
            running = metrics.get(names.running, 0.0)
            batch = running if running >= 1 else n_tok * itl / window
            iters.append(
                IterationStat(
                    t_start=now, duration_s=itl, decode_batch=max(1, round(batch)), prefill_tokens=0
                )
            )
        ttft, n_first = mean(names.ttft)
        prompt = d(names.prompt_tokens)
        if ttft > 0 and prompt > 0 and role is not Role.DECODE:
            queued, _ = mean(names.queue)
            iters.append(
                IterationStat(
                    t_start=now,
                    duration_s=max(ttft - queued, 1e-6),
                    decode_batch=0,
                    prefill_tokens=max(1, round(prompt / n_first)),
                )
            )
        transfers: list[KVTransferStat] = []
        lat_ms, n_xfer = mean(names.kv_latency_ms) if names.kv_latency_ms else (0.0, 0.0)
        if n_xfer and role is not Role.COLOCATED:
            speed, _ = mean(names.kv_speed)
            direction = "send" if role is Role.PREFILL else "recv"
            transfers.append(
                KVTransferStat(
                    transfer_id="sglang-metrics",
                    bytes=int(speed * 1e9 * lat_ms / 1e3),
                    duration_s=lat_ms / 1e3,
                    direction=direction,
                )
            )
        return EngineTelemetry(iterations=tuple(iters), transfers=tuple(transfers))


__all__ = ["MetricNames", "MetricsDelta"]
