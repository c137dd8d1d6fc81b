"""Inference engines behind one contract (:mod:`pearl.engines.base`): torch, sim, sglang, vllm.

Two families: in-process engines run their own serving loop (``torch``, ``sim``; their base
is :class:`~pearl.engines.in_process.InProcessEngine`); server engines launch and drive a
third-party server per worker over HTTP (``sglang``, ``vllm``; their base is
:class:`~pearl.engines.server.ServerEngine`).
``pearl.engines.torch.TorchEngine`` (imports torch and transformers), ``SGLangEngine`` and
``VLLMEngine`` are not re-exported here; a worker host builds its engine from its config with
:func:`pearl.engines.factory.build_engine`.
"""

from __future__ import annotations

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
from pearl.engines.in_process import InProcessEngine
from pearl.engines.model_backend import ServingConfig
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
    "InProcessEngine",
    "SimCost",
    "SimEngine",
    "SimEngineConfig",
]
