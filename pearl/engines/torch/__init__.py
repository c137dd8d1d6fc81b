"""The torch engine: a Qwen3-architecture model from ``transformers`` on CPU or CUDA."""

from pearl.engines.torch.engine import TorchEngine, TorchEngineConfig
from pearl.engines.torch.model import PRESETS
from pearl.engines.torch.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "PRESETS",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "TorchEngine",
    "TorchEngineConfig",
    "load_tokenizer",
]
