"""Bounds on the numbers PEARL takes from outside: GPU ids, training steps, weights versions and
preemption deadlines.

Checked at the edge, before anything is expanded or logged: :func:`pearl.config.parse_gpus`
(config files, ``--gpus``, Ray node labels) checks a range before it expands it.
"""

from __future__ import annotations

from typing import Any

MAX_GPU_ID = (1 << 20) - 1  # GPU ids are 0..1,048,575
MAX_GPUS = 1 << 16  # at most 65,536 GPU ids in one list


def gpu_ids_problem(gpus: Any) -> str | None:
    """Why ``gpus`` is not a list of GPU ids within bounds, or None."""
    if not isinstance(gpus, list | tuple):
        return f"expected a list of GPU ids, got {type(gpus).__name__}"
    if len(gpus) > MAX_GPUS:
        return f"{len(gpus)} GPU ids, at most {MAX_GPUS} in one list"
    for g in gpus:
        if not isinstance(g, int) or isinstance(g, bool):
            return f"GPU id {g!r} is not an int"
        if not 0 <= g <= MAX_GPU_ID:
            return f"GPU id {g} is out of range: GPU ids are 0-{MAX_GPU_ID}"
    return None


__all__ = [
    "MAX_GPUS",
    "MAX_GPU_ID",
    "gpu_ids_problem",
]
