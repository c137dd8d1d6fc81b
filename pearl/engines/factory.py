"""Build the engine a worker host runs from the ``[engine]`` config section.

``sim`` takes its cost model from the catalog roofline of the configured model and GPU (so a sim
worker costs what the decision engine's priors say); ``torch`` runs a real Qwen3-architecture model
on CPU or CUDA; ``sglang`` launches and drives one SGLang server per worker (the ``sglang`` extra is
needed where servers run, not here); ``vllm`` one vLLM server per worker, from the environment
``engine.vllm.python`` names.
"""

from __future__ import annotations

from typing import Any, assert_never

from pearl.config import EngineConfig, EngineKind
from pearl.core import catalog
from pearl.core.state import Role
from pearl.engines.base import Engine, KVChannel


def sim_cost(
    model: str, gpu: str, tp: int, context: float = 8192.0, vocab: int = 0, start_s: float = 60.0
) -> Any:
    """SimCost of one worker from the catalog roofline (Table 3 hand-off costs stay as shipped)."""
    from pearl.engines.sim import SimCost

    roof = catalog.roofline(model, gpu, tp, context=context, seq_tokens=2 * context)
    return SimCost(
        A=roof.A,
        b=roof.b,
        t_prefill=roof.t_prefill,
        kv_bytes_per_token=int(roof.K),
        kv_bandwidth=roof.BW,
        start_s=start_s,
        **({"vocab_size": vocab} if vocab else {}),
    )


def build_engine(
    cfg: EngineConfig, *, model: str, gpu: str, tp: int, role: Role, kv_channel: KVChannel | None
) -> Engine:
    if cfg.kind is EngineKind.SIM:
        from pearl.engines.sim import SimEngine

        return SimEngine(
            cost=sim_cost(model, gpu, tp, vocab=cfg.sim.vocab, start_s=cfg.sim.start_s),
            role=role,
            kv_channel=kv_channel,
            time_scale=cfg.sim.time_scale,
        )
    if cfg.kind is EngineKind.TORCH:
        from pearl.engines.torch import TorchEngine

        t = cfg.torch
        preset, path = (t.preset, "") if "/" not in t.preset else ("tiny", t.preset)
        return TorchEngine(
            role=role,
            kv_channel=kv_channel,
            preset=preset,
            model_path=path,
            device=t.device,
            threads=t.threads,
            seed=t.seed,
            kv_budget_bytes=int(t.kv_budget_mb * (1 << 20)),
            # a worker of tp slots is tp virtual devices on its one thread
            device_share=None if t.device_share is None else t.device_share * tp,
        )
    if cfg.kind is EngineKind.SGLANG:  # launches a server process; never imports sglang itself
        from pearl.engines.sglang import SGLangEngine, SGLangEngineConfig
        from pearl.engines.sglang.launch import first_gpu, spec_from_config

        spec = spec_from_config(cfg.sglang, tp=tp, first_gpu=first_gpu())
        return SGLangEngine(
            SGLangEngineConfig(spec, startup_timeout_s=cfg.sglang.startup_timeout_s),
            role=role,
            kv_channel=kv_channel,
        )
    if cfg.kind is EngineKind.VLLM:  # launches a server process from vLLM's own environment
        from pearl.engines.process import first_gpu
        from pearl.engines.vllm import VLLMEngine, VLLMEngineConfig
        from pearl.engines.vllm import spec_from_config as vllm_spec

        return VLLMEngine(
            VLLMEngineConfig(
                vllm_spec(cfg.vllm, tp=tp, first_gpu=first_gpu()),
                startup_timeout_s=cfg.vllm.startup_timeout_s,
            ),
            role=role,
            kv_channel=kv_channel,
        )
    assert_never(cfg.kind)


__all__ = ["build_engine", "sim_cost"]
