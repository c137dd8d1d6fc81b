"""Inference engines behind one contract (:mod:`pearl.engines.base`): torch, sglang, sim.

``pearl.engines.torch.TorchEngine`` (imports torch and transformers, so not re-exported here) and
:class:`SimEngine` take the same ``role`` and ``kv_channel`` keywords plus their own options; a
worker host builds one from its config with :func:`pearl.engines.factory.build_engine`.
"""

from __future__ import annotations

from pearl.engines.backend import ServingConfig
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
from pearl.engines.serving import ServingEngine
from pearl.engines.sim import SimCost, SimEngine, SimEngineConfig

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
    "ServingConfig",
    "ServingEngine",
    "SimCost",
    "SimEngine",
    "SimEngineConfig",
]
