"""The ``sglang`` engine: the engine contract mapped onto one supervised SGLang server.

``SGLangEngine(SGLangEngineConfig(server=ServerSpec(model_path=...)), role=..., kv_channel=...)``
launches the server for its role at ``start()`` (or attaches to ``config.url``), waits for health,
detects the server version, and then:

- ``generate`` posts ``/generate`` from a thread pool; the future resolves with the answer.
  Under PD the PEARL Router hands the prefill engine the decode worker's KV inbox (``kv_peer``);
  the prefill engine draws a bootstrap room, tells the decode engine its bootstrap host/port/room
  through the :class:`~pearl.engines.base.KVChannel` under the request's ``transfer_id``, and both
  post the same body with those fields; SGLang moves the KV (mooncake/nixl), the decode answer is
  the result. No hand-off within ``kv_timeout_s`` raises :class:`KVTimeout` (the router retries).
- ``abort`` posts ``/abort_request``; the pending ``/generate`` returns with the tokens so far.
- ``release_memory`` aborts what is in flight, waits until the server is idle (SGLang requires it),
  then ``/release_memory_occupation``; ``resume_memory`` undoes it and applies weights that were
  published meanwhile.
- ``load_weights`` maps a directory (or a safetensors file, overlaid on the model directory) to
  ``/update_weights_from_disk`` and :class:`DistributedWeights` to
  ``/update_weights_from_distributed`` (the trainer broadcasts), both with ``weight_version``.
- ``set_role`` uses ``/pd_role_switch`` where the server supports it (prefill <-> decode, 0.5.21+)
  and restarts the server with the new ``--disaggregation-mode`` otherwise.
- ``telemetry`` turns ``/metrics`` deltas into iteration and transfer stats.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.core.errors import RequestRefused
from pearl.core.state import Role
from pearl.engines.base import (
    EngineBase,
    EngineError,
    EngineTelemetry,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    KVChannel,
    KVTimeout,
)
from pearl.engines.lifecycle import EngineState, Lifecycle, Server
from pearl.engines.sglang import protocol as P
from pearl.engines.sglang.client import SGLangClient
from pearl.engines.sglang.handoff import Call, aborted_result, await_room, offer_room, resolve
from pearl.engines.sglang.launch import ServerProcess, ServerSpec, launch_command
from pearl.engines.sglang.supervisor import Watchdog
from pearl.engines.sglang.telemetry import MetricsDelta
from pearl.engines.sglang.weights import DistributedWeights, check_source, overlay_model_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SGLangEngineConfig:
    server: ServerSpec
    url: str = ""  # attach to a server PEARL did not launch (no restart-based role changes)
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 3600.0
    kv_timeout_s: float = 30.0  # decode: wait this long for the prefill side's bootstrap hand-off
    idle_timeout_s: float = 60.0  # release/role change: wait this long for aborted requests
    log_path: str = ""
    max_concurrency: int = 1024
    env: dict[str, str] | None = field(default=None, compare=False)


class SGLangEngine(EngineBase):
    kind = "sglang"
    roles = tuple(P.MODES)

    def __init__(
        self,
        config: SGLangEngineConfig,
        *,
        role: Role = Role.COLOCATED,
        kv_channel: KVChannel | None = None,
    ) -> None:
        self.cfg = config
        self.kv_channel = kv_channel
        self._check_role(role)
        self._role = role
        self.spec = config.server.with_role(role)
        self.client = SGLangClient(config.url or self.spec.url)
        self.server: ServerProcess | None = None
        self._cv = threading.Condition()
        self._calls: dict[str, Call] = {}
        self._version = 0
        self._weights: Any = None  # the last weights source (re-applied after a restart)
        self._pending: tuple[int, Any] | None = None
        self._life = Lifecycle(self.kind)
        self._watchdog: Watchdog | None = None
        # Told why once the watchdog gives up on the server (the worker host then exits).
        self.on_gone: Callable[[str], None] | None = None
        self._pool = ThreadPoolExecutor(config.max_concurrency, thread_name_prefix="sglang-req")
        self._metrics = MetricsDelta()

    # -- properties ----------------------------------------------------------------------------

    @property
    def version(self) -> str:
        """The server's SGLang version (after ``start``)."""
        return self.client.detect().version

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        with self._cv:
            if self._life.state is not EngineState.NEW:
                raise EngineError("sglang engine was already started; build a new one")
            self._life.to(EngineState.SERVING)
        self._launch()
        if self.server is not None:
            self._watchdog = Watchdog(
                lambda: self.server is None or self.server.alive(),
                self._relaunch,
                self._give_up,
                what="SGLang server",
            )

    def _relaunch(self) -> None:
        """Watchdog: the server died. Same role, weights re-applied, memory released again."""
        with self._cv:
            self._life.server_to(Server.RELAUNCHING)
        try:
            self._launch()
            if self._version and self._weights is not None:
                self._apply_weights(self._version, self._weights)
            if self._life.released:
                self.client.release_memory()
        finally:
            with self._cv:
                if self._life.server is Server.RELAUNCHING:
                    self._life.server_to(Server.UP)

    def _give_up(self, reason: str) -> None:
        with self._cv:
            self._life.server_to(Server.GONE, f"{reason}; see {self._log_path()}")
        log.error("the SGLang server is gone: %s; see %s", reason, self._log_path())
        if self.on_gone is not None:  # its host ends: its supervisor restarts it, or gives up
            self.on_gone(f"the SGLang server is gone: {reason}")

    def _log_path(self) -> str:
        return str(self.server.log_path) if self.server is not None else "its log"

    def _launch(self) -> None:
        if not self.cfg.url:
            self.server = ServerProcess(
                launch_command(self.spec), self.cfg.log_path or None, self.cfg.env, "sglang"
            )
        alive = self.server.alive if self.server is not None else None
        try:
            self.client.wait_healthy(self.cfg.startup_timeout_s, alive)
        except EngineError as e:
            tail = self.server.tail() if self.server is not None else ""
            if self.server is not None:
                self.server.stop()
            raise EngineError(f"{e}\n{tail}") from None
        self.client.forget()
        info = self.client.detect()
        if info.mode != P.MODES[self._role]:
            raise EngineError(
                f"server {self.client.base} runs disaggregation mode {info.mode!r}, "
                f"this engine's role {self._role} needs {P.MODES[self._role]!r}"
            )
        self._metrics.reset(self.client.metrics())

    def stop(self) -> None:
        """Abort what is in flight (waiting briefly for the prefixes), then stop the server."""
        with self._cv:
            if self._life.stopping:
                return
            self._life.to(EngineState.STOPPING)
            calls = list(self._calls.items())
        if self._watchdog is not None:
            self._watchdog.stop()
        for rid, call in calls:
            call.aborted = True
            self._try_abort(rid)
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
            call = self._calls[request.rid] = Call(Future())
        self._pool.submit(self._run, request, call, self._role)
        return call.future

    def _run(self, req: GenerateRequest, call: Call, role: Role) -> None:
        try:
            boot = self._bootstrap(req, call, role)
            if call.aborted:
                resolve(call.future, aborted_result(req.rid, self._version))
                return
            try:
                out = self.client.generate(P.generate_body(req, boot), self.cfg.request_timeout_s)
            except RequestRefused:
                raise
            except EngineError as e:
                if role is not Role.COLOCATED:
                    raise
                # The server died or failed, not the request: it resumes (empty prefix) on the
                # relaunched server or elsewhere, within the request's time.
                log.warning("SGLang server lost %s: %s", req.rid, e)
                resolve(call.future, aborted_result(req.rid, self._version, len(req.input_ids)))
                return
            result = P.result_of(req.rid, out, role, self._version)
            if (
                role is Role.DECODE
                and result.finish_reason is FinishReason.ABORT
                and not result.output_ids
                and not call.aborted
            ):
                reason = (out.get("meta_info") or {}).get("finish_reason")
                raise KVTimeout(
                    f"decode server dropped {req.rid} before its first token "
                    f"(KV transfer failed: {reason}); retry on a prefill/decode pair"
                )
            resolve(call.future, result)
        except BaseException as e:
            resolve(call.future, error=e)
        finally:
            with self._cv:
                self._calls.pop(req.rid, None)
                self._cv.notify_all()

    def _bootstrap(self, req: GenerateRequest, call: Call, role: Role) -> P.Bootstrap | None:
        """PD: the prefill side draws the room and tells the decode side; decode waits for it."""
        if role is Role.COLOCATED:
            return None
        assert self.kv_channel is not None
        if role is Role.PREFILL:
            return offer_room(self.kv_channel, req, self.spec.host, self.spec.bootstrap_port)
        return await_room(self.kv_channel, req, lambda: call.aborted, self.cfg.kv_timeout_s)

    def abort(self, rid: str) -> None:
        with self._cv:
            call = self._calls.get(rid)
            if call is None:
                return
            call.aborted = True
        threading.Thread(
            target=self._abort_until_done, args=(rid, call), daemon=True, name=f"abort-{rid}"
        ).start()

    def _abort_until_done(self, rid: str, call: Call) -> None:
        """Repeat the abort briefly: one sent before the server registered the rid is lost."""
        for _ in range(50):
            self._try_abort(rid)
            try:
                call.future.exception(0.2)
                return
            except TimeoutError:
                continue
            except BaseException:
                return

    def _try_abort(self, rid: str) -> None:
        try:
            self.client.abort(P.wire_rid(rid))
        except EngineError as e:
            log.debug("abort %s: %s", rid, e)

    def _requests(self) -> dict[str, Call]:
        return self._calls

    def _quiesce(self, what: str) -> None:
        """Abort everything in flight and wait until the server is idle (SGLang requires it)."""
        self.abort_all()
        if not self.drain(self.cfg.idle_timeout_s):
            raise EngineError(
                f"{what}: {len(self.in_flight())} requests still running after "
                f"{self.cfg.idle_timeout_s:.0f}s of aborting; the server is stuck"
            )

    # -- memory, weights, roles ----------------------------------------------------------------

    def release_memory(self) -> None:
        """Abort what is in flight (prefixes kept in the results), then free weights and KV."""
        self._need_running("release_memory")
        with self._cv:
            if self._life.state not in (EngineState.SERVING, EngineState.DRAINING):
                return  # released, or being released by another call
            self._life.to(EngineState.RELEASING)
        try:
            self._quiesce("release_memory")
            self.client.release_memory()
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
        self.client.resume_memory()
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
        if self._life.released:  # applied by resume_memory (lazy propagation)
            check_source(source)
            self._pending = (version, source)
        else:
            self._apply_weights(version, source)
        self._version = version

    def _apply_weights(self, version: int, source: Any) -> None:
        check_source(source)
        if isinstance(source, DistributedWeights):
            self.client.update_weights_from_distributed(
                list(source.names),
                list(source.dtypes),
                [list(s) for s in source.shapes],
                version,
                source.group_name,
            )
        else:
            path = Path(source)
            overlay = overlay_model_dir(self.spec.model_path, path) if path.is_file() else None
            try:  # the server has read the weights when its update answers
                self.client.update_weights_from_disk(str(overlay or path), version)
            finally:
                if overlay is not None:
                    shutil.rmtree(overlay, ignore_errors=True)
            self._weights = source

    def set_role(self, role: Role) -> None:
        self._check_role(role)
        self._need_running("set_role")
        with self._cv:
            if self._calls:
                raise EngineError(
                    f"set_role({role}) needs an idle engine; {len(self._calls)} "
                    "requests are in flight: drain or abort them first"
                )
        if role is self._role:
            return
        info = self.client.detect()
        if info.role_switch and Role.COLOCATED not in (role, self._role):
            self.client.pd_role_switch(P.MODES[role])
        else:
            self._restart(role)
        self._role = role
        self.spec = self.spec.with_role(role)

    def _restart(self, role: Role) -> None:
        """A new server in the new mode (same port), back at the current weights and memory."""
        if self.cfg.url:
            raise EngineError(
                f"role change {self._role} -> {role} needs a server restart, but "
                f"the server at {self.cfg.url} was not launched by PEARL"
            )
        if self._watchdog is not None:
            self._watchdog.pause()
        if self.server is not None:
            self.server.stop()
        old = self._role
        self._role, self.spec = role, self.spec.with_role(role)
        try:
            self._launch()
        except EngineError:
            self._role, self.spec = old, self.spec.with_role(old)
            raise
        finally:
            if self._watchdog is not None:
                self._watchdog.resume()
        if self._version and self._weights is not None:
            self._apply_weights(self._version, self._weights)
        if self._life.released:
            self.client.release_memory()

    def telemetry(self) -> EngineTelemetry:
        if not self._life.running or self._life.server is not Server.UP:
            return EngineTelemetry()
        try:
            return self._metrics.update(self.client.metrics(), self._role)
        except EngineError as e:  # a scrape is best-effort: the next one covers the window
            log.debug("metrics: %s", e)
            return EngineTelemetry()


__all__ = ["SGLangEngine", "SGLangEngineConfig"]
