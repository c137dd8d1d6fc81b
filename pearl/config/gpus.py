"""GPU lists: ``[0, 1, 2]``, ``"0-15"`` or ``"16-19,24"`` in a config; sorted id tuples in code."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from pearl.core.bounds import MAX_GPU_ID, MAX_GPUS, gpu_ids_problem
from pearl.core.errors import ConfigError

GpuList = tuple[int, ...]

# One item of a GPU list string: an id or a range, ASCII digits only (Python's int() also takes
# "٣" and "1_000").
_GPU_ITEM = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?", re.ASCII)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def parse_gpus(value: object, where: str = "gpus") -> GpuList:
    """``[0, 1, 2]``, ``"0-3"``, ``"0-3,8"`` or ``""`` -> a sorted tuple of distinct ids.

    Ids are 0..MAX_GPU_ID, at most MAX_GPUS of them (:mod:`pearl.core.bounds`); a range is checked
    before it is expanded, so a typo such as ``24-2000000000`` is one line, not the machine's
    memory."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str):
        spans: list[tuple[int, int]] = []
        count = 0
        parts = [p.strip() for p in value.split(",")]
        if parts == [""]:
            parts = []  # "" and "  ": no GPU
        for part in parts:
            shown = part if len(part) <= 40 else part[:37] + "..."
            if not part:
                raise ConfigError(
                    f"{where}: {value!r} has an empty item between commas; "
                    "write ids and ranges like 0-3,8"
                )
            m = _GPU_ITEM.fullmatch(part)
            try:
                if m is None:
                    raise ValueError(part)
                a = int(m[1])
                b = int(m[2]) if m[2] is not None else a
            except ValueError:  # not one, or more digits than int() converts
                raise ConfigError(
                    f"{where}: {shown!r} is not a GPU id or range like 0-15 "
                    "(ASCII digits 0-9, no signs or underscores)"
                ) from None
            if b < a:
                raise ConfigError(f"{where}: range {shown!r} runs backwards")
            if b > MAX_GPU_ID:
                raise ConfigError(f"{where}: {shown!r} is out of range: GPU ids are 0-{MAX_GPU_ID}")
            count += b - a + 1
            if count > MAX_GPUS:
                raise ConfigError(
                    f"{where}: more than {MAX_GPUS} GPU ids (at {shown!r}); at most {MAX_GPUS} "
                    "in one list"
                )
            spans.append((a, b))
        value = [g for a, b in spans for g in range(a, b + 1)]
    if not isinstance(value, list | tuple) or not all(
        isinstance(g, int) and not isinstance(g, bool) for g in value
    ):
        raise ConfigError(f"{where}: expected GPU ids (a list of ints >= 0 or a range string)")
    why = gpu_ids_problem(value)
    if why is not None:
        raise ConfigError(f"{where}: {why}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: a GPU id appears twice")
    return tuple(sorted(value))


def format_gpus(gpus: Iterable[int]) -> str:
    """The inverse of :func:`parse_gpus`: ``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``; ``"-"`` for none."""
    ids = sorted(gpus)
    if not ids:
        return "-"
    parts, lo, prev = [], ids[0], ids[0]
    for g in [*ids[1:], None]:
        if g is not None and g == prev + 1:
            prev = g
            continue
        parts.append(str(lo) if lo == prev else f"{lo}-{prev}")
        if g is not None:
            lo = prev = g
    return ",".join(parts)


__all__ = ["GpuList", "available_cores", "format_gpus", "parse_gpus"]
