"""The ``sglang`` engine: the engine contract mapped onto one supervised SGLang server.

``SGLangEngine(SGLangEngineConfig(server=ServerSpec(model_path=...)), role=..., kv_channel=...)``
launches the server for its role at ``start()`` (or attaches to ``config.url``), waits for health,
detects the server version, and then (launch, watch, relaunch, stop and pending weights are
:class:`~pearl.engines.server.ServerEngine`'s; this module speaks SGLang's dialect):

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
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.core.errors import RequestRefused
from pearl.core.state import Role
from pearl.engines.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    KVTimeout,
)
from pearl.engines.server import Call, ServerEngine, ServerEngineConfig, aborted_result
from pearl.engines.server_metrics import MetricNames
from pearl.engines.sglang import protocol as P
from pearl.engines.sglang.client import SGLangClient
from pearl.engines.sglang.handoff import await_room, offer_room
from pearl.engines.sglang.launch import ServerSpec, launch_command
from pearl.engines.sglang.weights import DistributedWeights, check_source, overlay_model_dir

log = logging.getLogger(__name__)

# SGLang's series: inter-token latency (before 0.5, time per output token), and the KV transfer
# latency and speed of PD servers.
METRICS = MetricNames(
    itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    ttft="sglang:time_to_first_token_seconds",
    queue="sglang:queue_time_seconds",
    running="sglang:num_running_reqs",
    prompt_tokens="sglang:prompt_tokens_total",
    kv_latency_ms="sglang:kv_transfer_latency_ms",
    kv_speed="sglang:kv_transfer_speed_gb_s",
)


@dataclass(frozen=True)
class SGLangEngineConfig(ServerEngineConfig[ServerSpec]):
    kv_timeout_s: float = 30.0  # decode: wait this long for the prefill side's bootstrap hand-off
    env: dict[str, str] | None = field(default=None, compare=False)


class SGLangEngine(ServerEngine[Call]):
    kind = "sglang"
    server_name = "SGLang"
    metric_names = METRICS
    roles = tuple(P.MODES)
    cfg: SGLangEngineConfig
    spec: ServerSpec
    client: SGLangClient

    @property
    def version(self) -> str:
        """The server's SGLang version (after ``start``)."""
        return self.client.detect().version

    # -- the server ----------------------------------------------------------------------------

    def _spec_for(self, server: ServerSpec, role: Role) -> ServerSpec:
        return server.with_role(role)

    def _client_for(self, url: str) -> SGLangClient:
        return SGLangClient(url)

    def _command(self) -> list[str]:
        return launch_command(self.spec)

    def _env(self) -> dict[str, str] | None:
        return self.cfg.env

    def _check_server(self) -> None:
        self.client.forget()
        info = self.client.detect()
        if info.mode != P.MODES[self._role]:
            raise EngineError(
                f"server {self.client.base} runs disaggregation mode {info.mode!r}, "
                f"this engine's role {self._role} needs {P.MODES[self._role]!r}"
            )

    # -- requests ------------------------------------------------------------------------------

    def _new_call(self) -> Call:
        return Call(Future())

    def _run(self, req: GenerateRequest, call: Call, role: Role) -> GenerateResult:
        boot = self._bootstrap(req, call, role)
        if call.aborted:
            return aborted_result(req.rid, self._version)
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
            return aborted_result(req.rid, self._version, len(req.input_ids))
        result = P.result_of(rid=req.rid, body=out, role=role, version=self._version)
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
        return result

    def _bootstrap(self, req: GenerateRequest, call: Call, role: Role) -> P.Bootstrap | None:
        """PD: the prefill side draws the room and tells the decode side; decode waits for it."""
        if role is Role.COLOCATED:
            return None
        assert self.kv_channel is not None
        if role is Role.PREFILL:
            return offer_room(
                channel=self.kv_channel, req=req, host=self.spec.host, port=self.spec.bootstrap_port
            )
        return await_room(
            channel=self.kv_channel,
            req=req,
            aborted=lambda: call.aborted,
            timeout_s=self.cfg.kv_timeout_s,
        )

    def _abort_running(self, rid: str, call: Call) -> None:
        threading.Thread(
            target=self._abort_until_done, args=(rid, call), daemon=True, name=f"abort-{rid}"
        ).start()

    def _abort_until_done(self, rid: str, call: Call) -> None:
        """Repeat the abort briefly: one sent before the server registered the rid is lost."""
        for _ in range(50):
            self._abort_once(rid, call)
            try:
                call.future.exception(0.2)
                return
            except TimeoutError:
                continue
            except BaseException:
                return

    def _abort_once(self, rid: str, call: Call) -> None:
        try:
            self.client.abort(P.wire_rid(rid))
        except EngineError as e:
            log.debug("abort %s: %s", rid, e)

    # -- memory, weights, roles ----------------------------------------------------------------

    def _rest(self) -> None:
        self.client.release_memory()

    def _wake(self) -> None:
        self.client.resume_memory()

    def _checked_weights(self, source: Any) -> Any:
        check_source(source)
        return source

    def _apply_weights(self, version: int, source: Any) -> None:
        check_source(source)
        if isinstance(source, DistributedWeights):
            self.client.update_weights_from_distributed(
                names=list(source.names),
                dtypes=list(source.dtypes),
                shapes=[list(s) for s in source.shapes],
                version=version,
                group_name=source.group_name,
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
        old = self._role  # _launch stops the server it replaces
        self._role, self.spec = role, self.spec.with_role(role)
        try:
            self._launch()
        except EngineError:
            self._role, self.spec = old, self.spec.with_role(old)
            raise
        finally:
            if self._watchdog is not None:
                self._watchdog.resume()
        self._restore()


__all__ = ["METRICS", "SGLangEngine", "SGLangEngineConfig"]
