"""Engine telemetry from SGLang's ``/metrics``: counter and histogram deltas between two scrapes.

An SGLang server does not report its scheduler iterations one by one, so each scrape window
becomes at most one representative stat of each kind, what the Runtime Tracker fits from:

- decode: mean inter-token latency (``sglang:inter_token_latency_seconds``, before that
  ``sglang:time_per_output_token_seconds``) as the iteration time, at the running batch size
  (the ``sglang:num_running_reqs`` gauge, else tokens x latency / window);
- prefill: mean time to first token less mean queueing time, over the mean prompt tokens of the
  requests that got their first token in the window;
- KV transfers: mean ``sglang:kv_transfer_latency_ms`` at the mean ``kv_transfer_speed_gb_s``.
"""

from __future__ import annotations

import time

from pearl.core.state import Role
from pearl.engines.base import EngineTelemetry, IterationStat, KVTransferStat

ITL = ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")
TTFT = "sglang:time_to_first_token_seconds"
QUEUE = "sglang:queue_time_seconds"
KV_LAT = "sglang:kv_transfer_latency_ms"
KV_SPEED = "sglang:kv_transfer_speed_gb_s"


class MetricsDelta:
    """Remembers the previous scrape; :meth:`update` returns the stats of the window since."""

    def __init__(self) -> None:
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

        iters: list[IterationStat] = []
        itl, n_tok = next(((m, n) for m, n in (mean(h) for h in ITL) if n), (0.0, 0.0))
        if itl > 0:
            running = metrics.get("sglang:num_running_reqs", 0.0)
            batch = running if running >= 1 else n_tok * itl / window
            iters.append(IterationStat(now, itl, max(1, round(batch)), 0))
        ttft, n_first = mean(TTFT)
        prompt = d("sglang:prompt_tokens_total")
        if ttft > 0 and prompt > 0 and role is not Role.DECODE:
            queued, _ = mean(QUEUE)
            iters.append(
                IterationStat(now, max(ttft - queued, 1e-6), 0, max(1, round(prompt / n_first)))
            )
        transfers: list[KVTransferStat] = []
        lat_ms, n_xfer = mean(KV_LAT)
        if n_xfer and role is not Role.COLOCATED:
            speed, _ = mean(KV_SPEED)
            direction = "send" if role is Role.PREFILL else "recv"
            transfers.append(
                KVTransferStat(
                    "sglang-metrics", int(speed * 1e9 * lat_ms / 1e3), lat_ms / 1e3, direction
                )
            )
        return EngineTelemetry(tuple(iters), tuple(transfers))


__all__ = ["ITL", "KV_LAT", "KV_SPEED", "QUEUE", "TTFT", "MetricsDelta"]
