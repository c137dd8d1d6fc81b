"""Inference engines behind one contract (:mod:`pearl.engines.base`): torch, sglang, sim."""

from pearl.engines.base import (
    Engine,
    EngineError,
    EngineTelemetry,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    IterationStat,
    KVChannel,
    KVTimeout,
    KVTransferStat,
    SamplingParams,
)

__all__ = [
    "Engine",
    "EngineError",
    "EngineTelemetry",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "IterationStat",
    "KVChannel",
    "KVTimeout",
    "KVTransferStat",
    "SamplingParams",
]
