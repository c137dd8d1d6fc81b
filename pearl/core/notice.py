"""Preemption notices: the pure rules for GPUs that will be reclaimed at a known deadline.

A cloud warns before it takes a spot GPU back (AWS 120 s, GCP 30 s). PEARL marks the GPUs
leaving (``gpus-reclaiming``), plans for the budget after the deadline at once, routes no new
turn to their workers, lets the turns that can finish before the deadline finish — predicted
from the tracker's per-turn time (eq. 1's turn term) — and migrates the rest early (abort keeping
the generated prefix, resubmit elsewhere), so that when the reclaim arrives nothing runs there.

Deadlines are wall-clock Unix seconds (what the log stores). Pure: time is an argument.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from pearl.core.errors import InvalidNotice
from pearl.core.profile import WorkloadProfile

MAX_NOTICE_S = 3600.0  # a deadline further ahead than this is refused (not a preemption notice)
# The worker is stopped this long before its deadline, and every turn still on it is migrated
# twice as long before: its host is gone, and nothing runs there, when the GPUs are taken.
STOP_LEAD_S = 0.5

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str, what: str = "--deadline") -> float:
    """Seconds in ``30s``, ``2m``, ``1.5m``, ``500ms``, ``1h`` or a bare number of seconds."""
    m = _DURATION.match(text)
    if m is None:
        raise InvalidNotice(
            f"{what}: expected a duration such as 30s, 2m or 90 (seconds), got {text!r}"
        )
    return float(m.group(1)) * _UNIT[m.group(2)]


def check_deadline(deadline: float, wall: float) -> None:
    """Refuse a deadline in the past or more than :data:`MAX_NOTICE_S` ahead of ``wall``."""
    left = deadline - wall
    if not math.isfinite(deadline) or left <= 0:
        raise InvalidNotice(
            f"gpus-reclaiming: the deadline is {-left:.1f} s in the past (deadline "
            f"{deadline:.3f}, now {wall:.3f}, Unix seconds); send gpus-reclaimed if the GPUs are "
            "gone already, or a deadline in the future (e.g. --deadline 30s)"
        )
    if left > MAX_NOTICE_S:
        raise InvalidNotice(
            f"gpus-reclaiming: the deadline is {left:.0f} s away, more than the "
            f"{MAX_NOTICE_S:.0f} s a notice may give; send it again closer to the reclaim"
        )


def due(leaving: Mapping[int, float], wall: float, lead: float = STOP_LEAD_S) -> list[int]:
    """GPUs whose reclaim is treated as arrived now (their deadline, less the stop lead)."""
    return sorted(g for g, d in leaving.items() if d - lead <= wall)


def worker_deadline(gpus: Iterable[int], leaving: Mapping[int, float]) -> float | None:
    """When a worker on ``gpus`` must be empty: the earliest notice on any of them (or None)."""
    ds = [leaving[g] for g in gpus if g in leaving]
    return min(ds) if ds else None


def turn_seconds(p: WorkloadProfile, per_worker: float) -> float:
    """Eq. 1's per-turn time on one worker serving ``per_worker`` sequences: prefill of the
    turn's new tokens for all of them, r decode iterations, the switching overhead."""
    k = max(1.0, per_worker)
    return k * p.prefill_per_turn * p.t_prefill + p.r * (p.A + p.b * k) + p.T_over


def to_migrate(
    turns: Mapping[str, float],
    turn_s: float,
    deadline: float,
    now: float,
    lead: float = STOP_LEAD_S,
) -> list[str]:
    """Turns (id -> start time) on a leaving worker to abort and resubmit elsewhere now: those
    predicted to end after ``deadline - 2 * lead`` (started + turn_s), and every one once that
    cutoff has come. The others finish where they are."""
    cutoff = deadline - 2 * lead
    if now >= cutoff:
        return sorted(turns)
    return sorted(rid for rid, t0 in turns.items() if max(t0 + turn_s, now) > cutoff)


__all__ = [
    "MAX_NOTICE_S",
    "STOP_LEAD_S",
    "check_deadline",
    "due",
    "parse_duration",
    "to_migrate",
    "turn_seconds",
    "worker_deadline",
]
