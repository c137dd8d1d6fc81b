"""The torch engine: a Qwen3-architecture model from ``transformers`` on CPU or CUDA.

Its names load on first use, so that importing a module of this package (the SGLang-dialect
facade, ``python -m pearl.engines.torch.http``, which can serve the sim engine) does not import
torch until something needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pearl.engines.torch.engine import TorchEngine, TorchEngineConfig
    from pearl.engines.torch.model import PRESETS
    from pearl.engines.torch.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

_WHERE = {
    "TorchEngine": "engine",
    "TorchEngineConfig": "engine",
    "PRESETS": "model",
    "ByteTokenizer": "tokenizer",
    "HFTokenizer": "tokenizer",
    "Tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "PRESETS",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "TorchEngine",
    "TorchEngineConfig",
    "load_tokenizer",
]
