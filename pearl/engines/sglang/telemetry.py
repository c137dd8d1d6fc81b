"""Engine telemetry from SGLang's ``/metrics`` (see :mod:`pearl.engines.server_metrics`)."""

from __future__ import annotations

from pearl.engines.server_metrics import MetricNames
from pearl.engines.server_metrics import MetricsDelta as _MetricsDelta

ITL = ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")
TTFT = "sglang:time_to_first_token_seconds"
QUEUE = "sglang:queue_time_seconds"
KV_LAT = "sglang:kv_transfer_latency_ms"
KV_SPEED = "sglang:kv_transfer_speed_gb_s"
NAMES = MetricNames(
    itl=ITL,
    ttft=TTFT,
    queue=QUEUE,
    running="sglang:num_running_reqs",
    prompt_tokens="sglang:prompt_tokens_total",
    kv_latency_ms=KV_LAT,
    kv_speed=KV_SPEED,
)


class MetricsDelta(_MetricsDelta):
    """SGLang's series (``sglang:inter_token_latency_seconds``, before that
    ``sglang:time_per_output_token_seconds``; ``sglang:num_running_reqs``; the KV transfer
    latency and speed of PD servers)."""

    def __init__(self) -> None:
        super().__init__(NAMES)


__all__ = ["ITL", "KV_LAT", "KV_SPEED", "NAMES", "QUEUE", "TTFT", "MetricsDelta"]
