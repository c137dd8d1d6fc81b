"""Tensors to bulk frames and back: raw bytes plus (name, dtype, shape) in the meta, never pickle.

Used for KV caches (prefill -> decode) and for weight snapshots over ``transports.bulk``; the
frames are zero-copy views of contiguous CPU tensors.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from pearl.engines.base import EngineError

_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


def to_frames(named: dict[str, torch.Tensor]) -> tuple[dict[str, Any], list[Any]]:
    """Meta ``{"tensors": [[name, dtype, shape], ...]}`` and one byte buffer per tensor."""
    specs, frames = [], []
    for name, t in named.items():
        t = t.detach().to("cpu").contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise EngineError(f"tensor {name}: dtype {dtype} cannot be shipped")
        specs.append([name, dtype, list(t.shape)])
        frames.append(t.view(-1).view(torch.uint8).numpy() if t.numel() else b"")
    return {"tensors": specs}, frames


def from_frames(meta: dict[str, Any], frames: list[Any]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`to_frames`; tensors share the received buffers (read-only views)."""
    specs = meta.get("tensors")
    if not isinstance(specs, list) or len(specs) != len(frames):
        raise EngineError(
            f"bulk meta describes {len(specs) if isinstance(specs, list) else '?'} "
            f"tensors but {len(frames)} frames came"
        )
    out = {}
    for (name, dtype, shape), buf in zip(specs, frames, strict=True):
        if dtype not in _DTYPES:
            raise EngineError(f"tensor {name}: unknown dtype {dtype!r}")
        d = _DTYPES[dtype]
        n = 1
        for s in shape:
            n *= int(s)
        size = memoryview(buf).nbytes
        if size != n * torch.tensor([], dtype=d).element_size():
            raise EngineError(f"tensor {name}: {size} bytes do not hold {dtype}{shape}")
        if n == 0:
            out[name] = torch.empty(shape, dtype=d)
            continue
        with warnings.catch_warnings():  # received buffers are read-only; we only read them
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(buf, dtype=torch.uint8)
        out[name] = raw.view(d).view(shape)
    return out


__all__ = ["from_frames", "to_frames"]
