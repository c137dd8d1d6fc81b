"""The ``vllm`` engine: the engine contract mapped onto one supervised vLLM server.

``VLLMEngine(VLLMEngineConfig(server=VLLMSpec(model_path=...)))`` launches the server at
``start()`` (or attaches to ``config.url``), waits for ``/health``, and then:

- ``generate`` streams ``/v1/completions`` with the prompt's token ids, greedy or sampled as the
  request says, every stop left to the request's stop ids (``ignore_eos``), and reads the
  sampled token ids and their logprobs as they come;
- ``abort`` closes the request's stream: vLLM aborts a request whose client left, and the
  result keeps the tokens read so far (``FinishReason.ABORT``), so the turn resumes elsewhere
  with its prefix. A server that dies or fails mid-request also yields its prefix (perhaps
  empty): the request is not at fault, and resumes on the relaunched server or elsewhere. A
  request the server refuses (4xx) fails with :class:`RequestRefused`: final, never retried;
- ``release_memory`` aborts what is in flight (prefixes kept), then puts the server to sleep
  (CUDA, ``--enable-sleep-mode``: device memory freed, weights kept in host memory) or pauses
  it (CPUs, where vLLM has no sleep mode: the process stays, nothing is scheduled);
  ``resume_memory`` undoes it and applies weights published meanwhile;
- ``load_weights`` loads a published safetensors snapshot in place through PEARL's worker
  extension (``/collective_rpc``), drops the prefix cache computed with the old weights, and
  sets vLLM's own weight version; never a restart per version;
- ``telemetry`` turns ``/metrics`` deltas into iteration stats.

vLLM pools serve colocated only: PEARL's prefill-decode hand-off needs a KV connector that runs
on this platform (see docs/vllm.md).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
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
)
from pearl.engines.lifecycle import EngineState, Lifecycle, Server
from pearl.engines.process import ServerProcess, Watchdog
from pearl.engines.server_metrics import MetricNames, MetricsDelta
from pearl.engines.vllm.client import Completion, VLLMClient
from pearl.engines.vllm.launch import SERVED_NAME, VLLMSpec, launch_command, launch_env

log = logging.getLogger(__name__)

METRICS = MetricNames(
    itl=("vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds"),
    ttft="vllm:time_to_first_token_seconds",
    queue="vllm:request_queue_time_seconds",
    running="vllm:num_requests_running",
    prompt_tokens="vllm:prompt_tokens_total",
)
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


@dataclass(frozen=True)
class VLLMEngineConfig:
    server: VLLMSpec
    url: str = ""  # attach to a server PEARL did not launch
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 3600.0
    idle_timeout_s: float = 60.0  # release: wait this long for aborted requests to end
    log_path: str = ""
    max_concurrency: int = 1024


@dataclass
class _Call:
    future: Future[GenerateResult]
    aborted: bool = False
    completion: Completion | None = None


class VLLMEngine(EngineBase):
    kind = "vllm"
    roles = (Role.COLOCATED,)

    def __init__(
        self,
        config: VLLMEngineConfig,
        *,
        role: Role = Role.COLOCATED,
        kv_channel: KVChannel | None = None,
    ) -> None:
        check_role(role)
        self._role = role
        self.kv_channel = kv_channel
        self.cfg = config
        self.spec = config.server
        self.client = VLLMClient(config.url or self.spec.url)
        self.server: ServerProcess | None = None
        self._cv = threading.Condition()
        self._calls: dict[str, _Call] = {}
        self._version = 0
        self._weights: str | None = None  # the last snapshot loaded (re-applied after a crash)
        self._pending: tuple[int, str] | None = None  # published while released
        self._life = Lifecycle(self.kind)
        self._watchdog: Watchdog | None = None
        # Told why once the watchdog gives up on the server (the worker host then exits).
        self.on_gone: Callable[[str], None] | None = None
        self._pool = ThreadPoolExecutor(config.max_concurrency, thread_name_prefix="vllm-req")
        self._metrics = MetricsDelta(METRICS)

    # -- properties ----------------------------------------------------------------------------

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        with self._cv:
            if self._life.state is not EngineState.NEW:
                raise EngineError("vllm engine was already started; build a new one")
            self._life.to(EngineState.SERVING)
        self._launch()
        if self.server is not None:
            self._watchdog = Watchdog(
                lambda: self.server is None or self.server.alive(),
                self._relaunch,
                self._give_up,
                what="vLLM server",
            )

    def _launch(self) -> None:
        if not self.cfg.url:
            if self.server is not None:
                if not self.server.alive():  # its log goes with it: say how it ended
                    log.error("the vLLM server exited; its last lines:\n%s", self.server.tail())
                self.server.stop()  # a dead server's engine core and workers go with it
            self.server = ServerProcess(
                launch_command(self.spec),
                self.cfg.log_path or None,
                launch_env(self.spec),
                "vllm",
                group=True,
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
        self._metrics.reset(self._scrape())

    def _relaunch(self) -> None:
        """Watchdog: the server died. Requests in flight ended with their prefixes; a new
        server comes back at the current weights, asleep or paused again if it was."""
        with self._cv:
            self._life.server_to(Server.RELAUNCHING)
        try:
            self._launch()
            if self._version and self._weights is not None:
                self._apply_weights(self._version, self._weights)
            if self._life.released:
                self._rest()
        finally:
            with self._cv:
                if self._life.server is Server.RELAUNCHING:
                    self._life.server_to(Server.UP)

    def _give_up(self, reason: str) -> None:
        with self._cv:
            where = self.server.log_path if self.server is not None else "its log"
            self._life.server_to(Server.GONE, f"{reason}; see {where}")
        log.error("the vLLM server is gone: %s; see %s", reason, where)
        if self.on_gone is not None:  # its host ends: its supervisor restarts it, or gives up
            self.on_gone(f"the vLLM server is gone: {reason}")

    def stop(self) -> None:
        """Abort what is in flight (the prefixes kept), then stop the server."""
        with self._cv:
            if self._life.stopping:
                return
            self._life.to(EngineState.STOPPING)
            calls = list(self._calls)
        if self._watchdog is not None:
            self._watchdog.stop()
        for rid in calls:
            self.abort(rid)
        deadline = time.monotonic() + 5.0
        with self._cv:
            while self._calls and time.monotonic() < deadline:
                self._cv.wait(0.1)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.server is not None:
            self.server.stop()
        with self._cv:
            self._life.to(EngineState.STOPPED)

    # -- requests ------------------------------------------------------------------------------

    def generate(self, request: GenerateRequest) -> Future[GenerateResult]:
        with self._cv:
            self._admit(request)
            call = self._calls[request.rid] = _Call(Future())
        self._pool.submit(self._run, request, call)
        return call.future

    def _run(self, req: GenerateRequest, call: _Call) -> None:
        try:
            completion = self.client.completion(body(req), self.cfg.request_timeout_s)
            with self._cv:
                call.completion = completion
                aborted = call.aborted
            if aborted:
                completion.cancel()
            try:
                out = completion.run()
            except RequestRefused:
                raise
            except EngineError as e:  # the server died or failed: its prefix lives on
                out = completion.out
                log.warning(
                    "vLLM server lost %s after %d tokens: %s", req.rid, len(out.token_ids), e
                )
                call.aborted = True
            n = len(out.token_ids)
            if call.aborted or out.finish_reason is None:
                finish = FinishReason.ABORT
            else:
                finish = _FINISH.get(out.finish_reason, FinishReason.STOP)
            call.future.set_result(
                GenerateResult(
                    rid=req.rid,
                    output_ids=tuple(out.token_ids),
                    logprobs=tuple(out.logprobs[:n]) if req.return_logprobs else (),
                    finish_reason=finish,
                    weights_version=self._version,
                    prompt_tokens=len(req.input_ids),
                    cached_tokens=out.cached_tokens,
                )
            )
        except BaseException as e:
            if not call.future.done():
                call.future.set_exception(e)
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
            completion = call.completion
        if completion is not None:
            completion.cancel()

    def _requests(self) -> dict[str, _Call]:
        return self._calls

    # -- memory, weights, roles ----------------------------------------------------------------

    def release_memory(self) -> None:
        """Abort what is in flight (prefixes kept in the results), then sleep or pause."""
        self._need_running("release_memory")
        if self._life.released:
            return
        self.abort_all()
        if not self.drain(self.cfg.idle_timeout_s):
            raise EngineError(
                f"release_memory: {len(self.in_flight())} requests still running after "
                f"{self.cfg.idle_timeout_s:.0f}s of aborting; the server is stuck"
            )
        self._rest()
        with self._cv:
            self._life.to(EngineState.RELEASED)

    def _rest(self) -> None:
        if self.spec.sleep_mode:
            self.client.sleep(1)
        else:
            self.client.pause()

    def resume_memory(self) -> None:
        self._need_running("resume_memory")
        if not self._life.released:
            return
        if self.spec.sleep_mode:
            self.client.wake_up()
        else:
            self.client.resume()
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
        path = _snapshot(source)
        if self._life.released:  # applied by resume_memory (lazy propagation)
            self._pending = (version, path)
        else:
            self._apply_weights(version, path)
        self._version = version

    def _apply_weights(self, version: int, path: str) -> None:
        self.client.collective_rpc("pearl_load_weights", path)
        self.client.reset_prefix_cache()  # its KV was computed with the old weights
        self.client.update_weight_version(version)
        self._weights = path

    def set_role(self, role: Role) -> None:
        self._check_role(role)

    def telemetry(self) -> EngineTelemetry:
        if not self._life.running or self._life.server is not Server.UP:
            return EngineTelemetry()
        try:
            return self._metrics.update(self._scrape(), Role.COLOCATED)
        except EngineError as e:  # a scrape is best-effort: the next one covers the window
            log.debug("metrics: %s", e)
            return EngineTelemetry()

    def _scrape(self) -> dict[str, float]:
        try:
            return self.client.metrics()
        except EngineError:
            return {}

    def _check_role(self, role: Role) -> None:
        check_role(role)


_CAUSE = re.compile(r"\b[A-Za-z_.]*(Error|Exception)\b: .+")


def cause_of(tail: str) -> str:
    """The last ``SomethingError: message`` line of a server's output (why it exited: a port
    taken, no model at the path, an architecture vLLM does not know), or ""."""
    for line in reversed(tail.splitlines()):
        m = _CAUSE.search(line)
        if m is not None:
            return m.group(0)[:300]
    return ""


def check_role(role: Role) -> None:
    if role is not Role.COLOCATED:
        raise EngineError(
            f"a vLLM worker serves colocated only, not {role}: PEARL has no prefill-decode "
            "hand-off through a vLLM KV connector on this platform (docs/vllm.md); set "
            "daemon.pd = 'colocated' for vLLM pools"
        )


def body(req: GenerateRequest) -> dict[str, Any]:
    """The ``/v1/completions`` body of one request: token ids in, token ids and the sampled
    tokens' logprobs out; only the request's own stop ids end it before its length."""
    s = req.sampling
    out: dict[str, Any] = {
        "model": SERVED_NAME,
        "prompt": list(req.input_ids),
        "max_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "ignore_eos": True,
        "stop_token_ids": list(s.stop_ids),
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stream_options": {"include_usage": True},
    }
    if req.return_logprobs:
        out["logprobs"] = 0  # the sampled token's own logprob, no alternatives
    if s.seed is not None:
        out["seed"] = s.seed
    return out


def _snapshot(source: Any) -> str:
    """A published snapshot: a ``.safetensors`` file or a directory of them."""
    if not isinstance(source, str | Path):
        raise EngineError(
            f"vllm engine: weights come as a safetensors file or directory, not "
            f"{type(source).__name__}"
        )
    path = Path(source)
    if not path.exists():
        raise EngineError(f"vllm engine: no weights at {path}")
    return str(path.resolve())


__all__ = ["METRICS", "VLLMEngine", "VLLMEngineConfig", "body", "cause_of", "check_role"]
