"""``[daemon]`` and ``[ray]``: pearld itself, and where worker hosts run."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pearl.config.coerce import parse_fields
from pearl.core.policy import PD, Borrow


class Launcher(enum.StrEnum):
    """``daemon.launcher``: where worker hosts run."""

    LOCAL = "local"  # processes on this machine
    RAY = "ray"  # Ray actors on the GPUs' nodes


DEFAULT_ENDPOINT = "tcp://127.0.0.1:7440"


@dataclass(frozen=True)
class DaemonConfig:
    """``[daemon]``: pearld itself."""

    endpoint: str = DEFAULT_ENDPOINT
    """Where pearld's API listens (loopback or ipc:// unless CURVE keys are given)."""
    keys_dir: str = ""
    """CURVE keys (``pearl keys generate``); required to bind a non-local address."""
    heartbeat_s: float = 1.0
    """Worker hosts heart-beat this often; dead after 3 missed."""
    tick_s: float = 0.5
    """How often the controller checks deadlines."""
    snapshot_every: int = 1000
    """Log records between snapshots of the table."""
    restart_budget: int = 3
    """Restarts of one worker host before it is given up."""
    restart_backoff_s: float = 1.0
    """First restart delay; doubles per restart."""
    reconcile_grace_s: float = 10.0
    """After a restart, how long workers get to re-register."""
    worker_orphan_s: float = 120.0
    """A worker host exits after pearld is unreachable this long."""
    borrow: Borrow = Borrow.GATED
    """Borrowing of training GPUs: by the gate (eq. 7), always, or never."""
    pd: PD = PD.ADAPTIVE
    """PD mode: chosen by the Decision Engine, or always colocated or disaggregated."""
    metrics: str = ""
    """Prometheus metrics over HTTP at HOST:PORT (port 0: any free port); "": off."""
    metrics_public: bool = False
    """Serve metrics on a non-loopback address (that port has no authentication)."""
    launcher: Launcher = Launcher.LOCAL
    """Where worker hosts run: processes here, or Ray actors on the GPUs' nodes."""
    # A torch host forked from the fork server starts without its ~6 CPU-s of imports.
    fork_hosts: bool = True
    """Local: fork worker hosts from one process that imported the engine once; false: one
    cold subprocess each."""

    def __post_init__(self) -> None:
        parse_fields(self, "daemon")


@dataclass(frozen=True)
class RayConfig:
    """``[ray]``: where worker hosts run when ``daemon.launcher = "ray"`` (docs/ray.md)."""

    address: str = "auto"
    """The cluster's GCS (HOST:PORT), or "auto": the one started on this machine."""
    namespace: str = "pearl"
    """Namespace of the hosts' detached, named actors."""
    node_events: bool = False
    """Turn node joins, deaths and drains into gpus-added / -reclaimed / -reclaiming events."""
    gpus_label: str = "pearl-gpus"
    """Node label naming the table's GPUs a node holds (pearl-gpus=8-15)."""
    poll_s: float = 0.5
    """How often the node table and the hosts' actors are read."""


__all__ = ["DEFAULT_ENDPOINT", "DaemonConfig", "Launcher", "RayConfig"]
