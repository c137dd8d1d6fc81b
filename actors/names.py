"""Every actor's name in the :class:`~actors.base.Directory`: each actor class takes its ``name``
from here, and whoever addresses an actor uses the same constant."""

from __future__ import annotations

ORCHESTRATOR = "orchestrator"
SCHEDULER = "scheduler"  # the ElasticScheduler: client events enter here
TRACKER = "tracker"  # the RuntimeTracker
DECISION = "decision"  # the DecisionEngine
ROUTER = "router"
SUPERVISOR = "supervisor"  # the RoleSupervisor
API = "api"  # the ApiEndpoint
PIPELINE = "pipeline"
NODES = "nodes"  # the RayNodeWatcher
REBUILDER = "rebuilder"  # the InterScaleRebuilder
TOGGLE = "toggle"  # the IntraScaleToggleManager
TRAINER = "trainer"  # registered by an embedding trainer; hears lend / reclaim hand-offs
ROLLOUT_CLIENT = "rollout-client"  # a RolloutClient's default name
GATEWAY = "gateway"  # the gateway's backend: hears table changes (trainer step boundaries)
ROUTES = "routes"  # the routes feed of gateway processes (pearl.gateway.feed)


def at(name: str, address: str) -> str:
    """The name of actor ``name`` in the process whose rpc server is ``address`` (a worker host
    resolves it to a courier of its own: a gateway process's Router)."""
    return f"{name}@{address}"


def worker_name(worker: int) -> str:
    """The name of worker ``worker``'s actor (in pearld, the courier to its host)."""
    return f"worker/{worker}"


__all__ = [
    "API",
    "DECISION",
    "GATEWAY",
    "NODES",
    "ORCHESTRATOR",
    "PIPELINE",
    "REBUILDER",
    "ROLLOUT_CLIENT",
    "ROUTER",
    "ROUTES",
    "SCHEDULER",
    "SUPERVISOR",
    "TOGGLE",
    "TRACKER",
    "TRAINER",
    "at",
    "worker_name",
]
