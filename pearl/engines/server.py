"""What the server engines share: the engine contract over one supervised server process.

Engines come in two families. In-process engines (``torch``, ``sim``) run their own serving
loop (:class:`~pearl.engines.in_process.InProcessEngine`). Server engines (``sglang``, ``vllm``)
launch a third-party server per worker host and drive it over HTTP: :class:`ServerEngine` is
their base, and owns everything that is not the server's dialect:

- launch: start the server (or attach to ``config.url``), wait for its health, and fail with
  the server's last lines (its ``SomethingError`` on the first line) when it does not come up;
- watch and relaunch: a :class:`~pearl.engines.process.Watchdog` notices a death and launches
  a new server at the current weights, released again if the engine was; past its budget it
  gives up: the server is GONE, requests are refused, and ``on_gone`` ends the worker host;
- stop: abort what is in flight, wait briefly for the prefixes, stop the server, and settle
  what is left as aborted; requests run on a thread pool, and one's failure fails it alone;
- memory and weights: release aborts and waits until the server is idle; weights published
  while released are pending until ``resume_memory``; telemetry is ``/metrics`` deltas.

A subclass keeps its dialect: the command line (:meth:`~ServerEngine._command`), one request
(:meth:`~ServerEngine._run`), how to abort one, to rest and wake the server, and to apply
weights.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pearl.core.state import Role
from pearl.engines.base import (
    EngineBase,
    EngineError,
    EngineTelemetry,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    KVChannel,
)
from pearl.engines.lifecycle import EngineState, Lifecycle, Server
from pearl.engines.process import ServerProcess, Watchdog, cause_of
from pearl.engines.server_metrics import MetricNames, MetricsDelta

log = logging.getLogger(__name__)

SpecT = TypeVar("SpecT")


@dataclass(frozen=True)
class ServerEngineConfig(Generic[SpecT]):
    """How a server engine runs its server (``server``: the dialect's launch spec)."""

    server: SpecT
    url: str = ""  # attach to a server PEARL did not launch (no relaunch, no restart)
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 3600.0
    idle_timeout_s: float = 60.0  # release: wait this long for aborted requests to end
    log_path: str = ""  # "": a log of PEARL's own, removed at stop (pearl.engines.process)
    max_concurrency: int = 1024


@dataclass
class Call:
    """One request in flight on a server engine."""

    future: Future[GenerateResult]
    aborted: bool = False


CallT = TypeVar("CallT", bound=Call)


class ServerClient(Protocol):
    """What the base asks of a dialect's HTTP client."""

    def wait_healthy(self, timeout_s: float, alive: Callable[[], bool] | None = None) -> None: ...

    def metrics(self) -> dict[str, float]: ...


def aborted_result(rid: str, version: int, prompt_tokens: int = 0) -> GenerateResult:
    """The result of a request aborted before its server produced anything."""
    return GenerateResult(
        rid=rid,
        output_ids=(),
        logprobs=(),
        finish_reason=FinishReason.ABORT,
        weights_version=version,
        prompt_tokens=prompt_tokens,
    )


def resolve(
    fut: Future[GenerateResult],
    result: GenerateResult | None = None,
    error: BaseException | None = None,
) -> None:
    """Settle ``fut`` once (later settlements are ignored)."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)  # type: ignore[arg-type]


class ServerEngine(EngineBase, Generic[CallT]):
    """The engine contract over one supervised server; subclasses speak the server's dialect.

    A subclass sets ``kind``, ``server_name`` (how messages name the server: "SGLang"),
    ``metric_names`` and ``process_group`` (the server's children die with it), and implements
    the abstract methods."""

    server_name: str
    metric_names: MetricNames
    process_group: bool = False
    cfg: ServerEngineConfig[Any]
    spec: Any  # the dialect's launch spec (a ``url``, and what the command line needs)
    client: ServerClient

    def __init__(
        self,
        config: ServerEngineConfig[Any],
        *,
        role: Role = Role.COLOCATED,
        kv_channel: KVChannel | None = None,
    ) -> None:
        self.cfg = config
        self.kv_channel = kv_channel
        self._check_role(role)
        self._role = role
        self.spec = self._spec_for(config.server, role)
        self.client = self._client_for(config.url or self.spec.url)
        self.server: ServerProcess | None = None
        self._cv = threading.Condition()
        self._calls: dict[str, CallT] = {}
        self._version = 0
        self._weights: Any = None  # the last weights that can be applied again (after a relaunch)
        self._pending: tuple[int, Any] | None = None  # published while released
        self._life = Lifecycle(self.kind)
        self._watchdog: Watchdog | None = None
        # Told why once the watchdog gives up on the server (the worker host then exits).
        self.on_gone: Callable[[str], None] | None = None
        self._pool = ThreadPoolExecutor(
            config.max_concurrency, thread_name_prefix=f"{self.kind}-req"
        )
        self._metrics = MetricsDelta(self.metric_names)

    # -- the dialect ---------------------------------------------------------------------------

    @abstractmethod
    def _spec_for(self, server: Any, role: Role) -> Any:
        """The launch spec of this engine's server in ``role`` (``server``: the config's)."""

    @abstractmethod
    def _client_for(self, url: str) -> ServerClient:
        """The dialect's client of the server at ``url``."""

    @abstractmethod
    def _command(self) -> list[str]:
        """The server's command line."""

    def _env(self) -> dict[str, str] | None:
        """The server's environment (None: this process's)."""
        return None

    def _check_server(self) -> None:
        """After health: raise EngineError unless the server is the one this engine needs."""

    @abstractmethod
    def _new_call(self) -> CallT:
        """The record of a request about to run."""

    @abstractmethod
    def _run(self, req: GenerateRequest, call: CallT, role: Role) -> GenerateResult:
        """One request on the server (a pool thread): its result, or raise."""

    @abstractmethod
    def _abort_once(self, rid: str, call: CallT) -> None:
        """Ask the server once to abort ``rid`` (already marked aborted); never raises."""

    def _abort_running(self, rid: str, call: CallT) -> None:
        """``abort``: make the server end ``rid`` (already marked aborted)."""
        self._abort_once(rid, call)

    @abstractmethod
    def _rest(self) -> None:
        """Free the server's memory (idle by now)."""

    @abstractmethod
    def _wake(self) -> None:
        """Undo :meth:`_rest`."""

    def _checked_weights(self, source: Any) -> Any:
        """``load_weights``: raise EngineError for a source this server cannot load; the source
        to apply (now, or at ``resume_memory``)."""
        return source

    @abstractmethod
    def _apply_weights(self, version: int, source: Any) -> None:
        """Load ``source`` as ``version`` now; set ``_weights`` where it can be applied again."""

    # -- launch, watch, relaunch, give up, stop ------------------------------------------------

    def start(self) -> None:
        with self._cv:
            if self._life.state is not EngineState.NEW:
                raise EngineError(f"{self.kind} engine was already started; build a new one")
            self._life.to(EngineState.SERVING)
        self._launch()
        if self.server is not None:
            self._watchdog = Watchdog(
                lambda: self.server is None or self.server.alive(),
                self._relaunch,
                self._give_up,
                what=f"{self.server_name} server",
            )

    def _launch(self) -> None:
        """Start the server (unless attached to ``cfg.url``) and wait until it is healthy."""
        if not self.cfg.url:
            if self.server is not None:
                if not self.server.alive():  # its log goes with it: say how it ended
                    tail = self.server.tail()
                    log.error("the %s server exited; its last lines:\n%s", self.server_name, tail)
                self.server.stop()  # a dead server's children go with it
            self.server = ServerProcess(
                argv=self._command(),
                log_path=self.cfg.log_path or None,
                env=self._env(),
                prefix=self.kind,
                group=self.process_group,
            )
        alive = self.server.alive if self.server is not None else None
        try:
            self.client.wait_healthy(self.cfg.startup_timeout_s, alive)
        except EngineError as e:
            tail = self.server.tail() if self.server is not None else ""
            if self.server is not None:
                self.server.stop()
            cause = cause_of(tail)  # on the first line: what status and the log show
            raise EngineError(f"{e}{': ' + cause if cause else ''}\n{tail}") from None
        self._check_server()
        self._metrics.reset(self._scrape())

    def _restore(self) -> None:
        """A new server: back at the current weights, and released again if the engine was."""
        if self._version and self._weights is not None:
            self._apply_weights(self._version, self._weights)
        if self._life.released:
            self._rest()

    def _relaunch(self) -> None:
        """Watchdog: the server died. Requests in flight ended with their prefixes; a new
        server comes back in the same role (:meth:`_restore`)."""
        with self._cv:
            self._life.server_to(Server.RELAUNCHING)
        try:
            self._launch()
            self._restore()
        finally:
            with self._cv:
                if self._life.server is Server.RELAUNCHING:
                    self._life.server_to(Server.UP)

    def _give_up(self, reason: str) -> None:
        where = self.server.log_path if self.server is not None else "its log"
        with self._cv:
            self._life.server_to(Server.GONE, f"{reason}; see {where}")
        log.error("the %s server is gone: %s; see %s", self.server_name, reason, where)
        if self.on_gone is not None:  # its host ends: its supervisor restarts it, or gives up
            self.on_gone(f"the {self.server_name} server is gone: {reason}")

    def stop(self) -> None:
        """Abort what is in flight (waiting briefly for the prefixes), then stop the server."""
        with self._cv:
            if self._life.stopping:
                return
            self._life.to(EngineState.STOPPING)
            calls = list(self._calls.items())
            for _, call in calls:
                call.aborted = True
        if self._watchdog is not None:
            self._watchdog.stop()
        for rid, call in calls:
            self._abort_once(rid, call)
        deadline = time.monotonic() + 5.0
        with self._cv:
            while self._calls and time.monotonic() < deadline:
                self._cv.wait(0.1)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.server is not None:
            self.server.stop()
        with self._cv:
            left = list(self._calls.items())
            self._calls.clear()
            self._life.to(EngineState.STOPPED)
        for rid, call in left:  # the server is gone: what it had is lost, say so
            resolve(call.future, aborted_result(rid, self._version))

    # -- requests ------------------------------------------------------------------------------

    def generate(self, request: GenerateRequest) -> Future[GenerateResult]:
        with self._cv:
            self._admit(request)
            call = self._calls[request.rid] = self._new_call()
        self._pool.submit(self._serve, request, call, self._role)
        return call.future

    def _serve(self, req: GenerateRequest, call: CallT, role: Role) -> None:
        try:
            resolve(call.future, self._run(req, call, role))
        except BaseException as e:
            resolve(call.future, error=e)
        finally:
            with self._cv:
                self._calls.pop(req.rid, None)
                self._cv.notify_all()

    def abort(self, rid: str) -> None:
        with self._cv:
            call = self._calls.get(rid)
            if call is None:
                return
            call.aborted = True
        self._abort_running(rid, call)

    def _requests(self) -> dict[str, CallT]:
        return self._calls

    def _quiesce(self, what: str) -> None:
        """Abort everything in flight and wait until the server is idle."""
        self.abort_all()
        if not self.drain(self.cfg.idle_timeout_s):
            raise EngineError(
                f"{what}: {len(self.in_flight())} requests still running after "
                f"{self.cfg.idle_timeout_s:.0f}s of aborting; the server is stuck"
            )

    # -- memory, weights, telemetry ------------------------------------------------------------

    def release_memory(self) -> None:
        """Abort what is in flight (prefixes kept in the results), then free weights and KV."""
        self._need_running("release_memory")
        with self._cv:
            if self._life.state not in (EngineState.SERVING, EngineState.DRAINING):
                return  # released, or being released by another call
            self._life.to(EngineState.RELEASING)
        try:
            self._quiesce("release_memory")
            self._rest()
        except BaseException:
            with self._cv:
                if self._life.state is EngineState.RELEASING:
                    self._life.to(EngineState.DRAINING if self._drainers else EngineState.SERVING)
            raise
        with self._cv:
            if self._life.state is EngineState.RELEASING:
                self._life.to(EngineState.RELEASED)

    def resume_memory(self) -> None:
        self._need_running("resume_memory")
        if not self._life.released:
            return
        self._wake()
        with self._cv:
            self._life.to(EngineState.DRAINING if self._drainers else EngineState.SERVING)
        if self._pending is not None:
            version, source = self._pending
            self._pending = None
            self._apply_weights(version, source)

    def load_weights(self, version: int, source: Any) -> None:
        self._need_running("load_weights")
        if version < self._version:
            raise EngineError(
                f"weights version {version} is older than the loaded version "
                f"{self._version}; refusing to go back"
            )
        source = self._checked_weights(source)
        if self._life.released:  # applied by resume_memory (lazy propagation)
            self._pending = (version, source)
        else:
            self._apply_weights(version, source)
        self._version = version

    def telemetry(self) -> EngineTelemetry:
        if not self._life.running or self._life.server is not Server.UP:
            return EngineTelemetry()
        return self._metrics.update(self._scrape(), self._role)

    def _scrape(self) -> dict[str, float]:
        try:
            return self.client.metrics()
        except EngineError as e:  # a scrape is best-effort: the next one covers the window
            log.debug("metrics: %s", e)
            return {}


__all__ = [
    "Call",
    "ServerClient",
    "ServerEngine",
    "ServerEngineConfig",
    "aborted_result",
    "resolve",
]
