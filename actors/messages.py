"""Message kinds between pearld's actors, worker hosts and trainers (besides log records and the
controller's commands, which travel unchanged). Registered in the transport's one registry so the
one codec encodes and checks them."""

from __future__ import annotations

from typing import Any

from pearl.core.bounds import version_problem
from pearl.core.errors import SchemaError
from pearl.core.profile import TrajectoryStats
from pearl.core.schema import WireStruct
from pearl.core.state import Role
from pearl.core.view import ClusterView
from pearl.engines.base import EngineTelemetry, GenerateRequest, GenerateResult
from transports.protocol import MESSAGES


@MESSAGES.add
class WorkerHello(WireStruct, tag="worker-hello", frozen=True, kw_only=True):
    """A worker host announces itself to pearld (again after a pearld restart)."""

    worker: int
    incarnation: int
    pid: int
    address: str  # its rpc server: commands reach its WorkerActor here
    kv_address: str = ""  # its KV inbox (prefill -> decode transfers)
    engine_ready: bool = False  # the engine already serves (a pearld restart found it running)
    role: Role | None = None
    metrics_address: str = ""  # HOST:PORT of its GET /metrics; "": not served (or an older host)
    node_id: str = ""  # the Ray node it runs on ("": not on Ray)
    handle: str = ""  # how its launcher names it (a Ray actor's name; "": its pid)


@MESSAGES.add
class WorkerBeat(WireStruct, tag="worker-beat", frozen=True, kw_only=True):
    """Heartbeat of a worker host; the reply carries pearld's boot id (a change means re-hello)."""

    worker: int
    incarnation: int


@MESSAGES.add
class Welcome(WireStruct, tag="welcome", frozen=True, kw_only=True):
    boot_id: str
    known: bool = True  # False: the log does not know this worker; it will be stopped


@MESSAGES.add
class RestoreWorker(WireStruct, tag="restore-worker", frozen=True, kw_only=True):
    """A restarted worker host: bring the engine up in ``role`` at ``weights_version``."""

    worker: int
    incarnation: int
    role: Role
    weights_version: int
    active: bool = True  # False: a retained overlap worker, keep device memory released


@MESSAGES.add
class Generate(WireStruct, tag="generate", frozen=True, kw_only=True):
    """Run one request on a worker; its result comes back as ``generate-done``, to pearld's
    Router, or to the Router of the gateway process whose rpc server is ``reply_to``."""

    request: GenerateRequest
    reply_to: str = ""


@MESSAGES.add
class GenerateDone(WireStruct, tag="generate-done", frozen=True, kw_only=True):
    worker: int
    rid: str
    result: GenerateResult | None = None
    error: str = ""
    retryable: bool = False  # e.g. the KV never arrived: route the request again
    refused: bool = False  # the server refused the request itself (4xx): final, never retried
    retry_after_s: float = 0.0  # > 0: no worker served it in its time; try again after this


@MESSAGES.add
class AbortRequest(WireStruct, tag="abort-request", frozen=True, kw_only=True):
    rid: str


@MESSAGES.add
class RouterRestarted(WireStruct, tag="router-restarted", frozen=True, kw_only=True):
    """pearld restarted the Router: the requests it held are gone; whoever sent them resends."""


@MESSAGES.add
class LoadWeights(WireStruct, tag="load-weights", frozen=True, kw_only=True):
    """Move to weights ``version`` (from the weight store at ``uri``; lazy propagation)."""

    version: int
    uri: str = ""


@MESSAGES.add
class EngineTelemetryReport(WireStruct, tag="engine-telemetry", frozen=True, kw_only=True):
    worker: int
    telemetry: EngineTelemetry


@MESSAGES.add
class StateChanged(WireStruct, tag="state-changed", frozen=True, kw_only=True):
    """The Orchestrator's view after a logged change: read its attributes (``view.routable``,
    ``view.table``, ``view.profile``); only the edge renders it as a dict (``status_json``)."""

    view: ClusterView

    @property
    def seq(self) -> int:
        return self.view.seq


@MESSAGES.add
class Supervise(WireStruct, tag="supervise", frozen=True, kw_only=True):
    """Periodic prod for the RoleSupervisor: reap dead hosts, restart with back-off."""


@MESSAGES.add
class TrainerHello(WireStruct, tag="trainer-hello", frozen=True, kw_only=True):
    """A trainer (embedding API client) that handles lend / reclaim of the training GPUs."""

    address: str


@MESSAGES.add
class Route(WireStruct, tag="route", frozen=True, kw_only=True):
    """Ask the Router to run ``request``; the result goes to actor ``reply_to`` as generate-done."""

    request: GenerateRequest
    reply_to: str
    wait_s: float = 0.0  # how long it may wait for a worker, retries included (0: the Router's)


@MESSAGES.add
class RolloutStep(WireStruct, tag="rollout-step", frozen=True, kw_only=True):
    """A rollout step ended: what its trajectories did (the Runtime Tracker fits the profile)."""

    step: int
    trajectories: tuple[TrajectoryStats, ...]
    makespan_s: float
    active_fraction: tuple[float, ...] = ()
    in_flight: float = 0.0  # mean trajectories in flight while the batch ran (0: not measured)
    start_spread_s: float | None = None  # its last group started this long after its first


@MESSAGES.add
class NextBatch(WireStruct, tag="next-batch", frozen=True, kw_only=True):
    """A trainer asks for the next rollout batch, waiting at most ``timeout_s`` on pearld's side."""

    timeout_s: float = 0.5


@MESSAGES.add
class BatchReply(WireStruct, tag="batch", frozen=True, kw_only=True):
    """The batch (``pearl.rl.trajectory.Batch`` as a plain mapping), or None: not ready yet."""

    batch: dict[str, Any] | None = None


@MESSAGES.add
class WeightsUpload(WireStruct, tag="weights-upload", frozen=True, kw_only=True):
    """Weights ``version`` as one bulk frame (safetensors bytes) for pearld's weight store."""

    version: int

    def __post_init__(self) -> None:
        # Refused when decoded, before the store writes a file no log record could name.
        why = version_problem(self.version)
        if why is not None:
            raise SchemaError(f"weights-upload refused: {why}; nothing was stored or logged")


__all__ = [
    "AbortRequest",
    "BatchReply",
    "NextBatch",
    "WeightsUpload",
    "Route",
    "RolloutStep",
    "EngineTelemetryReport",
    "Generate",
    "GenerateDone",
    "LoadWeights",
    "RestoreWorker",
    "StateChanged",
    "Supervise",
    "TrainerHello",
    "Welcome",
    "WorkerBeat",
    "WorkerHello",
]
