"""The demo's live line, rendered from a ``pearl status`` (pure: the live view supplies the time).

While rollout workers are being started, the line says so: how many, what they start (a vLLM or
SGLang server takes minutes on CPU: model load, compile, warm-up), and for how long so far.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pearl.core.status import ClusterStatus

# Engines that run a server process per worker, by ``engine.kind``: what the line calls them.
SERVERS = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclass(frozen=True)
class Counts:
    """Active rollout workers by role, in the overlap zone, and available by kind."""

    prefill: int
    decode: int
    colocated: int
    overlap: int  # borrowed from training
    workers: int
    reserved: int  # on reserved GPUs
    preemptible: int  # on preemptible GPUs (the trace's)


def counts(status: ClusterStatus) -> Counts:
    """The active rollout workers of ``status``, counted."""
    reserved = set(status.gpus.reserved)
    active = [w for w in status.workers if w.role != "training" and w.activity == "active"]
    dedicated = [w for w in active if w.zone != "overlap"]
    return Counts(
        prefill=sum(w.role == "prefill" for w in active),
        decode=sum(w.role == "decode" for w in active),
        colocated=sum(w.role == "colocated" for w in active),
        overlap=len(active) - len(dedicated),
        workers=len(active),
        reserved=sum(set(w.gpus) <= reserved for w in dedicated),
        preemptible=sum(not set(w.gpus) <= reserved for w in dedicated),
    )


def starting_workers(status: ClusterStatus) -> int:
    """Rollout workers being started: transitioning, and not under a step of the plan in flight
    that is something else (a role change, a drain, an activation). A worker a plan adds, a
    worker whose start continues in the background after its plan committed, and a worker whose
    engine is relaunched all transition while their engine (a server) comes up."""
    plan = status.plan or {}
    done = set(plan.get("done") or ())
    busy = {
        s.get("worker")
        for k, s in enumerate(plan.get("steps") or ())
        if s.get("op") != "add" and k not in done
    }
    return sum(
        1
        for w in status.workers
        if w.role != "training" and w.activity == "transitioning" and w.id not in busy
    )


def starting_note(n: int, engine: str, for_s: float) -> str:
    """``starting 2 vLLM servers: 45 s so far`` (``engine``: ``engine.kind``); '' for none."""
    if n <= 0:
        return ""
    what = f"{SERVERS[engine]} server" if engine in SERVERS else f"{engine or 'rollout'} worker"
    return f"starting {n} {what}{'s' if n != 1 else ''}: {max(0.0, for_s):.0f} s so far"


def live_line(
    status: ClusterStatus,
    *,
    t: float,
    state: Mapping[str, Any],
    event: str = "",
    engine: str = "",
    starting_s: float = 0.0,
) -> str:
    """One live line: time, step, mode and ratio, active workers by role, throughput, phase,
    reward, then workers starting (``starting_s``: since when, as the caller saw them first) or
    else the last event."""
    c = counts(status)
    ratio = f"{status.N_C}C" if status.mode == "colocated" else f"{status.N_P}P{status.N_D}D"
    acc = state.get("accuracy")
    note = starting_note(starting_workers(status), engine, starting_s) or event[:40]
    return (
        f"[{t:6.1f}s] step {state.get('step', 0):>3}  {status.mode:<13} {ratio:<5} "
        f"P{c.prefill} D{c.decode} C{c.colocated} (overlap {c.overlap})  "
        f"{state.get('throughput', 0.0):7.0f} tok/s  {status.phase:<8} "
        f"reward {state.get('reward', 0.0):.2f}"
        + (f" held-out {acc:.2f}" if acc is not None else "")
        + f"  {note}"
    )


__all__ = ["SERVERS", "Counts", "counts", "live_line", "starting_note", "starting_workers"]
