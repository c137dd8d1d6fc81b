"""The torch engine: a Qwen3-architecture model from ``transformers`` on CPU or CUDA."""

from pearl.engines.torch.engine import TorchEngine, TorchEngineConfig
from pearl.engines.torch.model import PRESETS

__all__ = [
    "PRESETS",
    "TorchEngine",
    "TorchEngineConfig",
]
