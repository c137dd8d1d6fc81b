"""Qwen3-architecture models for the torch engine: seeded random presets, or a local directory.

Weights come from one of four sources, remembered so ``release_memory`` can free them and
``resume_memory`` can bring the same version back: a seed (random init, reproducible), a local HF
directory, a file (safetensors or a torch-saved state dict), or an in-memory state dict.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from pearl.engines.base import EngineError

# Shapes only; weights are random (seeded) unless loaded. ``tiny`` is for tests, ``tiny32`` is
# ``tiny`` in heads of 32 (the same parameters; vLLM's CPU attention refuses head size 16),
# ``small`` for CPU benchmarks, ``qwen3-0.6b`` is the real model's shape (151,936-token vocabulary).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        initializer_range=0.25,
    ),
    "tiny32": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=4096,
        initializer_range=0.25,
    ),
    "small": dict(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=8192,
        initializer_range=0.1,
    ),
    "qwen3-0.6b": dict(
        vocab_size=151_936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40_960,
        initializer_range=0.02,
    ),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def preset_config(name: str) -> Qwen3Config:
    if name not in PRESETS:
        raise EngineError(f"unknown model preset {name!r}; presets: {sorted(PRESETS)}")
    return Qwen3Config(
        **PRESETS[name],
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        bos_token_id=256,
        eos_token_id=257,
        pad_token_id=258,
    )


def dir_config(path: str) -> Qwen3Config:
    """The Qwen3 config of a local model directory. Another architecture is refused: loaded
    into a Qwen3, its weights would be mapped wrongly or left at random, and it would serve
    garbage without a word."""
    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise EngineError(f"{path} is not a local Qwen3 model directory: {e}") from None
    kind = raw.get("model_type")
    if kind != "qwen3":
        archs = ", ".join(raw.get("architectures") or []) or "no architectures listed"
        raise EngineError(
            f"{path}: a {kind or 'unknown'} checkpoint ({archs}); the torch engine implements "
            "Qwen3 only (Qwen3ForCausalLM). Serve it with engine.kind = 'vllm'"
        )
    try:
        cfg = Qwen3Config.from_pretrained(path, local_files_only=True)
    except Exception as e:
        raise EngineError(f"{path} is not a local Qwen3 model directory: {e}") from None
    return cfg


def model_of(model_path: str, preset: str, seed: int) -> tuple[Qwen3Config, WeightSource]:
    """The architecture and initial weights: a local model directory if given, else a preset
    with random weights from ``seed``."""
    if model_path:
        return dir_config(model_path), WeightSource("dir", model_path)
    return preset_config(preset), WeightSource("seed", seed)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d = torch.device(device)
    if d.type == "cuda" and not torch.cuda.is_available():
        raise EngineError(f"device {device!r} asked for, but CUDA is not available here; use 'cpu'")
    return d


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise EngineError(f"dtype {dtype!r} is not one of {['auto', *DTYPES]}")
    return DTYPES[dtype]


@dataclasses.dataclass(frozen=True)
class WeightSource:
    """Where the current weights came from: kind is 'seed', 'dir', 'file' or 'state'."""

    kind: str
    value: Any


def build(
    config: Qwen3Config, source: WeightSource, device: torch.device, dtype: torch.dtype
) -> Any:
    """A model in eval mode on ``device`` holding the weights ``source`` names."""
    if source.kind == "seed":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(source.value))
            model: Any = Qwen3ForCausalLM(config)
        return model.to(device=device, dtype=dtype).eval()
    if source.kind == "dir":
        try:
            model = Qwen3ForCausalLM.from_pretrained(
                source.value, local_files_only=True, dtype=dtype
            )
        except Exception as e:
            raise EngineError(f"cannot load a Qwen3 model from {source.value}: {e}") from None
        return model.to(device=device).eval()
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    model = model.to(dtype=dtype).to_empty(device=device).eval()
    # to_empty leaves every tensor uninitialised and gives tied parameters separate storage: tie
    # them again (a store saves tied weights once) and recompute the non-persistent buffers
    # (rotary frequencies), which no state dict carries.
    model.tie_weights()
    with torch.device(device):
        model.model.rotary_emb = type(model.model.rotary_emb)(config)
    load_into(model, source)
    return model


def read_state(source: WeightSource) -> dict[str, torch.Tensor]:
    if source.kind == "state":
        return dict(source.value)
    path = Path(source.value)
    if not path.is_file():
        raise EngineError(f"weights file {path} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise EngineError(f"cannot read weights from {path}: {e}") from None
    if not isinstance(state, dict):
        raise EngineError(f"{path} holds a {type(state).__name__}, expected a state dict")
    return state


def load_into(model: Any, source: WeightSource) -> None:
    """Copy a state dict (file or mapping) into the model's parameters, checking every name."""
    state = read_state(source)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise EngineError(f"weights do not fit the model: {e}") from None
    if model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise EngineError(
            f"weights do not match the model: missing {missing[:5]}, unexpected "
            f"{list(unexpected)[:5]}"
        )


def source_of(version_source: Any) -> WeightSource:
    """The WeightSource for what ``load_weights`` was given."""
    if isinstance(version_source, dict):
        return WeightSource("state", version_source)
    if isinstance(version_source, str | Path):
        p = Path(version_source)
        return WeightSource("dir" if p.is_dir() else "file", str(p))
    raise EngineError(
        f"weights source must be a path or a state dict, got {type(version_source).__name__}"
    )


def kv_bytes_per_token(config: Qwen3Config, dtype: torch.dtype) -> int:
    """K and V of one token over all layers."""
    elem = torch.tensor([], dtype=dtype).element_size()
    c: Any = config
    return 2 * int(c.num_hidden_layers) * int(c.num_key_value_heads) * int(c.head_dim) * elem


__all__ = [
    "DTYPES",
    "PRESETS",
    "WeightSource",
    "build",
    "dir_config",
    "kv_bytes_per_token",
    "load_into",
    "model_of",
    "preset_config",
    "read_state",
    "resolve_device",
    "resolve_dtype",
    "source_of",
]
