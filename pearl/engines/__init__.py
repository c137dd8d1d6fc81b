"""Inference engines behind one contract (:mod:`pearl.engines.base`): torch, sglang, sim.

A worker host builds its engine with :func:`create` (``"torch"`` imports torch and transformers
only when asked for); ``pearl.engines.torch.TorchEngine`` and :class:`SimEngine` take the same
``role`` and ``kv_channel`` keywords plus their own options.
"""

from __future__ import annotations

from typing import Any

from pearl.core.state import Role
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

KINDS = ("torch", "sim")


def create(kind: str, *, role: Role = Role.COLOCATED, kv_channel: KVChannel | None = None,
           **options: Any) -> Engine:
    """An engine of ``kind`` (not started): ``create("torch", preset="tiny", device="cpu")``."""
    if kind == "torch":
        from pearl.engines.torch import TorchEngine

        return TorchEngine(role=role, kv_channel=kv_channel, **options)
    if kind == "sim":
        return SimEngine(role=role, kv_channel=kv_channel, **options)
    raise EngineError(f"unknown engine kind {kind!r}; kinds: {list(KINDS)}")


__all__ = [
    "KINDS",
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
    "create",
]
