"""``[engine]`` and its table per engine: ``[engine.torch]``, ``[engine.sim]``,
``[engine.sglang]``, ``[engine.vllm]``.

``[engine]`` keeps what every engine shares (which engine, which router); each engine's own keys
live in its table, so ``engine.vllm.model_path`` is vLLM's and nothing else's. The flat keys of
before (``engine.vllm_model_path``) are refused with the key they moved to (:data:`MOVED`)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from pearl.config.coerce import parse_fields


class EngineKind(enum.StrEnum):
    """``engine.kind``: what serves the rollouts."""

    SIM = "sim"  # simulated workers (pearl.engines.sim)
    TORCH = "torch"  # PEARL's own torch engine (pearl.engines.torch)
    SGLANG = "sglang"  # one SGLang server per worker host
    VLLM = "vllm"  # one vLLM server per worker host; colocated only


class RouterKind(enum.StrEnum):
    """``engine.router``: what routes requests to the workers."""

    PEARL = "pearl"  # PEARL's own Router
    SGLANG_ROUTER = "sglang-router"  # the real sglang-router


class RoleSwitch(enum.StrEnum):
    """``engine.sglang.role_switch``: pass ``--enable-pd-role-switch`` to SGLang servers."""

    AUTO = "auto"  # when the installed SGLang has it (0.5.21+)
    ON = "on"
    OFF = "off"


@dataclass(frozen=True)
class TorchConfig:
    """``[engine.torch]``: PEARL's own torch engine (``engine.kind = "torch"``); the preset also
    names the model the gateway serves and the demo's warm start trains."""

    preset: str = "tiny"
    """Model preset (tiny, small, qwen3-0.6b) or a local model directory."""
    device: str = "cpu"
    """The torch device."""
    threads: int = 1
    """Threads per worker host."""
    # Each GPU id is a virtual device held by the engine (and the demo trainer) idling after
    # each step, one torch thread per slot; `pearl demo` sizes it to the cores it finds.
    device_share: float | None = None
    """Each GPU id is a virtual device of this share of one core; unset: unthrottled."""
    kv_budget_mb: float = 64.0
    """KV cache per worker, in MiB."""
    seed: int = 0
    """Seed of a preset's random weights."""


@dataclass(frozen=True)
class SimConfig:
    """``[engine.sim]``: simulated workers, the calibrated cost model (``engine.kind = "sim"``)."""

    time_scale: float = 0.01
    """A simulated second takes this many real seconds."""
    vocab: int = 0
    """Token ids are drawn below this (0: the model's vocabulary)."""
    start_s: float = 60.0
    """Cold start of a worker (process, model load, warm-up), in seconds."""


@dataclass(frozen=True)
class SGLangConfig:
    """``[engine.sglang]``: one SGLang server per worker host (``engine.kind = "sglang"``), and
    the sglang-router (``engine.router = "sglang-router"``)."""

    model_path: str = ""
    """``--model-path`` of the servers."""
    module: str = "sglang.launch_server"
    """The servers' module (pearl.engines.facade: the torch facade)."""
    host: str = "127.0.0.1"
    """Host the servers listen on."""
    port: int = 30000
    """Base port of the servers."""
    bootstrap_port: int = 8998
    """The prefill side's PD bootstrap base port (SGLang's default)."""
    transfer_backend: str = "mooncake"
    """KV transfer backend, mooncake or nixl."""
    memory_saver: bool = True
    """``--enable-memory-saver``, so that lending a worker frees its memory."""
    weights_cpu_backup: bool = False
    """Released memory keeps a CPU copy of the weights (resume needs no reload)."""
    role_switch: RoleSwitch = RoleSwitch.AUTO
    """``--enable-pd-role-switch``: auto (SGLang 0.5.21+), on or off."""
    extra_args: str = ""
    """Appended to every server's launch command."""
    startup_timeout_s: float = 600.0
    """How long a server may take to become healthy, in seconds."""
    router_urls: str = ""
    """sglang-router: "REGULAR_URL,PD_URL" of running routers; "": launch both."""
    router_port: int = 29100
    """sglang-router: launched routers' port (regular mode; PD mode on the next port)."""

    def __post_init__(self) -> None:
        parse_fields(self, "engine.sglang")


@dataclass(frozen=True)
class VllmConfig:
    """``[engine.vllm]``: one vLLM server per worker host (``engine.kind = "vllm"``)."""

    model_path: str = ""
    """A Hugging Face model directory (config, safetensors, tokenizer)."""
    tokenizer: str = ""
    """The tokenizer's directory, if not the model's (``--tokenizer``)."""
    python: str = ""
    """The servers' interpreter; "": .venv-vllm/bin/python when present."""
    host: str = "127.0.0.1"
    """Host the servers listen on."""
    port: int = 31000
    """Base port of the servers."""
    dtype: str = "bfloat16"
    """``--dtype`` of the weights."""
    max_model_len: int = 2048
    """``--max-model-len``: context limit in tokens."""
    enforce_eager: bool = True
    """No CUDA graphs or compilation, so a server starts in seconds."""
    # Off by default: on CPUs vLLM 0.32 kills its engine when it chunks the prefill of a seeded
    # request ("CPU Generator does not use offset").
    chunked_prefill: bool = False
    """Chunked prefill (turn it on for GPUs)."""
    sleep_mode: bool = False
    """``--enable-sleep-mode`` (CUDA only): lending a worker frees device memory."""
    kv_cache_mb: int = 512
    """Each server's KV cache, in MiB; 0: vLLM's default (92% of RAM on CPUs)."""
    extra_args: str = ""
    """Appended to every server's launch command."""
    startup_timeout_s: float = 600.0
    """How long a server may take to become healthy, in seconds."""


@dataclass(frozen=True)
class EngineConfig:
    """``[engine]``: what serves the rollouts on each worker host; each engine's own keys are in
    its table below.

    sglang and vllm: each worker host launches one server; its port is the base port plus the
    worker's first GPU id, so the router side finds every server from the table alone."""

    kind: EngineKind = EngineKind.SIM
    """The engine: simulated, PEARL's torch engine, SGLang or vLLM servers."""
    router: RouterKind = RouterKind.PEARL
    """What routes requests: PEARL's own Router, or the real sglang-router."""
    torch: TorchConfig = field(default_factory=TorchConfig)
    """``[engine.torch]``: the torch engine's keys."""
    sim: SimConfig = field(default_factory=SimConfig)
    """``[engine.sim]``: the simulated engine's keys."""
    sglang: SGLangConfig = field(default_factory=SGLangConfig)
    """``[engine.sglang]``: the SGLang servers' keys."""
    vllm: VllmConfig = field(default_factory=VllmConfig)
    """``[engine.vllm]``: the vLLM servers' keys."""

    def __post_init__(self) -> None:
        parse_fields(self, "engine")

    @property
    def colocated_only(self) -> bool:
        """vLLM pools serve colocated only: no prefill-decode hand-off through a vLLM KV
        connector on this platform (docs/vllm.md)."""
        return self.kind is EngineKind.VLLM


def _moved() -> dict[str, str]:
    out = {f"engine.{f.name}": f"engine.torch.{f.name}" for f in dataclasses.fields(TorchConfig)}
    out["engine.time_scale"] = "engine.sim.time_scale"
    out |= {f"engine.sim_{f.name}": f"engine.sim.{f.name}" for f in dataclasses.fields(SimConfig)}
    for table, cls in (("sglang", SGLangConfig), ("vllm", VllmConfig)):
        out |= {
            f"engine.{table}_{f.name}": f"engine.{table}.{f.name}" for f in dataclasses.fields(cls)
        }
    return out


MOVED: dict[str, str] = _moved()
"""Flat ``[engine]`` keys of before -> where they live now (``engine.vllm_model_path`` ->
``engine.vllm.model_path``)."""


__all__ = [
    "MOVED",
    "EngineConfig",
    "EngineKind",
    "RoleSwitch",
    "RouterKind",
    "SGLangConfig",
    "SimConfig",
    "TorchConfig",
    "VllmConfig",
]
