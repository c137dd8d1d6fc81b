"""The embedding API: a trainer drives PEARL in process or as a client of a running pearld.

    rt = pearl.Runtime.from_config("configs/local-cpu.toml").start()   # in process
    rt = pearl.connect("tcp://127.0.0.1:7440")                          # a running pearld
    for step in range(1, steps + 1):
        batch = rt.next_batch()                   # B trajectories within the staleness bound
        with rt.training(step):                   # Training Begin: returns once borrowed GPUs
            state = train(batch)                  # are back; Training Finished on exit
            rt.publish_weights(state, step)       # workers load it lazily
    rt.stop()

Both kinds offer the same methods, plus ``a``-prefixed asyncio variants (``anext_batch``,
``atraining``, ``apublish_weights``, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from actors import names
from pearl.core import events as ev
from pearl.core.errors import PearlError
from pearl.core.status import ClusterStatus

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from pearl.config import Config
    from pearl.plans import PlanSpan
    from pearl.rl.pipeline import PipelineStats
    from pearl.rl.trajectory import Batch

#: what :meth:`publish_weights` takes: a state dict, or a file in the weight store's format
Weights: TypeAlias = "Mapping[str, torch.Tensor] | str | Path"

TRAINING_WAIT_S = 600.0  # a return is bounded by step deadlines; this only guards a dead daemon


@dataclass(frozen=True)
class RuntimeStats:
    """What an in-process runtime's pearld counted so far (:meth:`Runtime.stats`)."""

    host_deaths: dict[str, int]  # worker hosts the supervisor declared dead, by reason
    # The committed plans that changed the PD mode (:meth:`pearl.plans.PlanHistory.switches`).
    switches: tuple[PlanSpan, ...]
    pipeline: PipelineStats | None  # None: this runtime runs no rollout pipeline


class TrainingTimeout(PearlError):
    """Borrowed GPUs did not come back in time for a training step."""


def wait_training_may_proceed(
    status: Callable[[], ClusterStatus],
    step: int,
    timeout_s: float = TRAINING_WAIT_S,
    since: float | None = None,
) -> float:
    """Poll the status view until pearld lets training ``step`` proceed (every borrowed GPU is
    back); the seconds since ``since`` (a ``time.monotonic()``, default now). Raises
    :class:`TrainingTimeout` once ``timeout_s`` have passed without the go-ahead."""
    t0 = time.monotonic() if since is None else since
    while status().training_may_proceed < step:
        if time.monotonic() - t0 > timeout_s:
            raise TrainingTimeout(
                f"borrowed GPUs not back {timeout_s:.0f}s after training-begin {step}"
            )
        time.sleep(0.005)
    return time.monotonic() - t0


class _Base(ABC):
    """What both runtimes share; subclasses provide the five primitives."""

    #: seconds from the last Training Begin to pearld's go-ahead (all borrowed GPUs back)
    last_return_s: float = 0.0
    #: the newest weights version published through this runtime (0: none yet)
    _published_version: int = 0

    @abstractmethod
    def _event(self, record: ev.Elastic) -> int:
        """Send an elastic event; its log sequence number once durable."""

    @abstractmethod
    def status(self) -> ClusterStatus:
        """The cluster status (typed; ``pearl status --json`` prints its mapping)."""

    @abstractmethod
    def _next_batch(self, timeout_s: float) -> Batch | None:
        """A ready batch, or None after ``timeout_s``."""

    @abstractmethod
    def _publish(self, version: int, weights: Weights) -> str:
        """Store weights ``version`` and log it."""

    @abstractmethod
    def stop(self) -> None:
        """Release what this runtime holds."""

    def start(self) -> _Base:
        return self

    def event(self, record: ev.Elastic) -> int:
        """Send an elastic event (gpus-added, gpus-reclaimed, ...); its sequence number once
        durable. ``training()`` sends the training notifications for you."""
        return self._event(record)

    def next_batch(self, timeout_s: float | None = None) -> Batch:
        """The next rollout batch (:class:`pearl.rl.trajectory.Batch`); waits for it."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            batch = self._next_batch(min(left, 1.0))
            if batch is not None:
                return batch
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no rollout batch within {timeout_s}s")

    @contextlib.contextmanager
    def training(
        self, step: int | None = None, weights_version: int | None = None
    ) -> Iterator[int]:
        """Training Begin on enter (returns once every borrowed GPU is back), Training Finished
        on exit with the newest published weights version."""
        if step is None:
            step = self.status().training_step + 1
        t0 = time.monotonic()
        self._event(ev.TrainingBegin(step=step))
        self.last_return_s = wait_training_may_proceed(self.status, step, since=t0)
        try:
            yield step
        finally:
            version = weights_version
            if version is None:
                # The status view lags the log by a publish: a version this runtime has just
                # published may not show there yet, and an older one is rejected.
                version = max(self.status().weights_version, self._published_version)
            self._event(ev.TrainingFinished(step=step, weights_version=version))

    def publish_weights(self, weights: Weights, version: int) -> str:
        """Write weights ``version`` (a state dict or a file path) to the weight store and tell
        pearld; serving workers move to it, joiners start from it. Returns its location."""
        where = self._publish(version, weights)
        self._published_version = max(self._published_version, version)
        return where

    # -- asyncio variants ---------------------------------------------------------------------

    async def astart(self) -> _Base:
        return await asyncio.to_thread(self.start)

    async def anext_batch(self, timeout_s: float | None = None) -> Batch:
        return await asyncio.to_thread(self.next_batch, timeout_s)

    async def apublish_weights(self, weights: Weights, version: int) -> str:
        return await asyncio.to_thread(self.publish_weights, weights, version)

    async def astatus(self) -> ClusterStatus:
        return await asyncio.to_thread(self.status)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    @contextlib.asynccontextmanager
    async def atraining(self, step: int | None = None) -> AsyncIterator[int]:
        cm = self.training(step)
        value = await asyncio.to_thread(cm.__enter__)
        try:
            yield value
        except BaseException as e:
            await asyncio.to_thread(cm.__exit__, type(e), e, e.__traceback__)
            raise
        else:
            await asyncio.to_thread(cm.__exit__, None, None, None)

    def __enter__(self) -> _Base:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Runtime(_Base):
    """PEARL in this process: pearld's actors, worker host processes, the rollout pipeline."""

    def __init__(self, cfg: Config, state_dir: Path) -> None:
        from pearl.daemon import Daemon

        self.cfg, self.state_dir = cfg, Path(state_dir)
        endpoint = cfg.daemon.endpoint
        if endpoint == _default_endpoint():  # in process: a private socket, no port clash
            endpoint = f"ipc://{self.state_dir.resolve()}/pearld.sock"
        self.daemon = Daemon(cfg, self.state_dir, endpoint)
        self._started = False

    @classmethod
    def from_config(
        cls,
        path: str | Path | None,
        *,
        state_dir: str | Path | None = None,
        overrides: Sequence[str] = (),
    ) -> Runtime:
        from pearl import config

        cfg = config.load(path, list(overrides))
        if state_dir is None:
            state_dir = Path("runs") / time.strftime("%Y%m%d-%H%M%S") / "state"
        return cls(cfg, Path(state_dir))

    @property
    def endpoint(self) -> str:
        return str(self.daemon.address)

    @property
    def gateway_url(self) -> str | None:
        """The OpenAI-compatible gateway's base URL (``http://HOST:PORT/v1``) while it serves
        (``[gateway] listen``), else None."""
        address = self.daemon.gateway_address
        return None if address is None else f"http://{address}/v1"

    def start(self) -> Runtime:
        if not self._started:
            self.daemon.start()
            self._started = True
        return self

    def _ask(self, name: str, msg: object, timeout_s: float = 30.0) -> Any:
        return self.daemon.directory.get(name).ask(msg, timeout_s)

    def _event(self, record: ev.Elastic | ev.WeightsPublished) -> int:
        return int(self._ask(names.SCHEDULER, record).seq)

    def status(self) -> ClusterStatus:
        from transports.protocol import StatusRequest

        status: ClusterStatus = self._ask(names.ORCHESTRATOR, StatusRequest())
        return status

    def stats(self) -> RuntimeStats:
        """What this process's pearld counted so far: host deaths, mode switches, and the
        rollout pipeline's groups, migrations and last batch."""
        from actors.supervisor import Deaths

        if not self._started:
            raise PearlError("the runtime is not started: its pearld counted nothing")
        pipeline = self.daemon.pipeline
        return RuntimeStats(
            host_deaths=dict(self._ask(names.SUPERVISOR, Deaths(), 5.0)),
            switches=tuple(self.daemon.plans.switches()),
            pipeline=None if pipeline is None else pipeline.stats(),
        )

    def _next_batch(self, timeout_s: float) -> Batch | None:
        return self.daemon.batches().take(timeout_s)

    def _publish(self, version: int, weights: Weights) -> str:
        from pearl.rl.weights import WeightStore

        path = WeightStore(self.state_dir / "weights").publish(version, weights)
        self._event(ev.WeightsPublished(version=version, uri=str(path)))
        return str(path)

    def stop(self) -> None:
        if self._started:
            self.daemon.stop()
            self._started = False


class RemoteRuntime(_Base):
    """A trainer talking to a pearld over ZeroMQ."""

    def __init__(self, endpoint: str, keys_dir: str | None = None, timeout_s: float = 10.0) -> None:
        from transports.auth import ClientKeys
        from transports.diagnose import DiagnosingClient

        keys = None
        if keys_dir:  # pearld started with daemon.keys_dir=DIR: DIR's client key pair
            try:
                keys = ClientKeys.load(keys_dir)
            except PearlError as e:
                raise PearlError(f"check keys_dir: {e}") from None
        self.endpoint = endpoint
        self.client = DiagnosingClient(
            endpoint,
            keys=keys,
            keys_dir=keys_dir or "",
            option="keys_dir",
            timeout_s=timeout_s,
            name="trainer",
        )

    def _event(self, record: ev.Elastic) -> int:
        from transports.protocol import Event

        return int(self.client.request(Event.of(record)).seq)

    def status(self) -> ClusterStatus:
        from transports.protocol import StatusRequest

        payload = self.client.request(StatusRequest()).payload
        if payload is None:
            raise PearlError(f"pearld at {self.endpoint} has not published its state yet")
        status: ClusterStatus = payload
        return status

    def _next_batch(self, timeout_s: float) -> Batch | None:
        from actors.messages import BatchReply, NextBatch
        from pearl.core.schema import from_plain
        from pearl.rl.trajectory import Batch

        reply = self.client.request(NextBatch(timeout_s=min(timeout_s, 0.5)), timeout_s + 5.0)
        assert isinstance(reply, BatchReply)
        return None if reply.batch is None else from_plain(Batch, reply.batch)

    def _publish(self, version: int, weights: Weights) -> str:
        from actors.messages import WeightsUpload

        if isinstance(weights, str | Path) and Path(weights).is_file():
            data = Path(weights).read_bytes()
        else:  # the weight store's own format (tied tensors once), written locally, then sent
            import tempfile

            from pearl.rl.weights import WeightStore

            with tempfile.TemporaryDirectory(prefix="pearl-upload-") as tmp:
                data = WeightStore(tmp).publish(version, weights).read_bytes()
        # One retry: the request's 60 s are shared by its attempts, each sending every byte.
        reply = self.client.request(WeightsUpload(version=version), 60.0, frames=(data,), retries=1)
        return str(reply.value)

    def stop(self) -> None:
        self.client.close()


def _default_endpoint() -> str:
    from pearl.config import DEFAULT_ENDPOINT

    return DEFAULT_ENDPOINT


def connect(
    endpoint: str, *, keys_dir: str | None = None, timeout_s: float = 10.0
) -> RemoteRuntime:
    """A client of the pearld at ``endpoint`` with the :class:`Runtime` methods.

    ``keys_dir``: the directory pearld was started with (``daemon.keys_dir``) when it uses CURVE.
    ``timeout_s`` bounds each request, its retries included: when nobody answers, the error comes
    within it and says whether authentication failed or nothing listens there.
    """
    rt = RemoteRuntime(endpoint, keys_dir, timeout_s)
    try:
        rt.status()  # fail now, clearly, when nobody answers
    except BaseException:
        rt.stop()  # its socket and monitor: a caller retrying must not collect them
        raise
    return rt


__all__ = [
    "RemoteRuntime",
    "Runtime",
    "RuntimeStats",
    "TrainingTimeout",
    "connect",
    "wait_training_may_proceed",
]
