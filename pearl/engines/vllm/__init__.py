"""The vLLM engine: one supervised vLLM server per worker host (``engine.kind = "vllm"``)."""

from pearl.engines.vllm.client import Completion, Stream, VLLMClient
from pearl.engines.vllm.engine import VLLMEngine, VLLMEngineConfig
from pearl.engines.vllm.launch import VLLMSpec, launch_command, spec_from_config

__all__ = [
    "Completion",
    "Stream",
    "VLLMClient",
    "VLLMEngine",
    "VLLMEngineConfig",
    "VLLMSpec",
    "launch_command",
    "spec_from_config",
]
