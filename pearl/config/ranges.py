"""Every number of every section in range: finite, > 0 or >= 0 where the key says so, and no
duration beyond a year."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from pearl.config.coerce import FIX
from pearl.core.errors import ConfigError

MAX_SECONDS = 365 * 86400.0
"""Longest duration a ``*_s`` key may give: a year (a longer wait overflows the clocks' APIs)."""

POSITIVE: dict[str, tuple[str, ...]] = {
    "cluster": ("tp",),
    "workload": ("batch", "group_size", "max_trajectory_tokens"),
    "daemon": (
        "heartbeat_s",
        "tick_s",
        "snapshot_every",
        "restart_backoff_s",
        "reconcile_grace_s",
        "worker_orphan_s",
    ),
    "engine.torch": ("threads", "kv_budget_mb"),
    "engine.sim": ("time_scale",),
    "engine.sglang": ("startup_timeout_s",),
    "engine.vllm": ("max_model_len", "startup_timeout_s"),
    "ray": ("poll_s",),
    "rl": ("tasks", "max_new_tokens"),
    "gateway": (
        "max_body_bytes",
        "max_streams",
        "request_timeout_s",
        "max_connections",
        "header_timeout_s",
        "body_timeout_s",
    ),
}
"""Keys that must be > 0 (counts of things that must exist, periods, timeouts), by the path of
their table."""

NON_NEGATIVE: dict[str, tuple[str, ...]] = {
    "workload": (
        "staleness",
        "turns",
        "new_tokens_per_turn",
        "generated_tokens_per_turn",
        "env_s",
        "theta",
        "turn_overhead_s",
    ),
    "decision": ("mode_switch_threshold", "ratio_change_threshold"),
    "gate": ("toggle_cost_s",),
    "daemon": ("restart_budget",),
    "engine.torch": ("seed",),
    "engine.sim": ("vocab", "start_s"),
    "engine.vllm": ("kv_cache_mb",),
    "rl": ("seed", "max_turns", "temperature"),
    "demo": ("eval_every", "trace_s"),
    "gateway": ("processes",),
}
"""Keys that must be >= 0 (0 has a meaning: none, off, the default). Every float key of every
section must also be finite, and every ``*_s`` key at most :data:`MAX_SECONDS`."""


def range_problem(name: str, value: object, default: object, sign: str) -> str | None:
    """Why ``value`` of key ``name`` is out of range, or None; ``sign``: ">", ">=" or ""."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return f"{name} must be a finite number, got {value!r}; {FIX} (default {default!r})"
    if sign == ">" and value <= 0 or sign == ">=" and value < 0:
        least = ">= 1" if sign == ">" and isinstance(value, int) else f"{sign} 0"
        return f"{name} must be {least}, got {value!r}; set it to e.g. its default, {default!r}"
    if name.endswith("_s") and value > MAX_SECONDS:
        return (
            f"{name} must be at most {MAX_SECONDS:.0f} s (a year), got {value!r}; "
            f"set a shorter duration (default {default!r})"
        )
    return None


def check_ranges(section: DataclassInstance, path: str) -> None:
    """Raise ConfigError for the first key of ``section`` (at ``path``, e.g. ``engine.vllm``)
    or of its nested tables that is out of range."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        name = f"{path}.{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_ranges(value, name)
            continue
        if f.name in POSITIVE.get(path, ()):
            sign = ">"
        elif f.name in NON_NEGATIVE.get(path, ()):
            sign = ">="
        else:
            sign = ""
        default = f.default if f.default is not dataclasses.MISSING else None
        why = range_problem(name=name, value=value, default=default, sign=sign)
        if why is not None:
            raise ConfigError(why)


__all__ = ["MAX_SECONDS", "NON_NEGATIVE", "POSITIVE", "check_ranges", "range_problem"]
