"""The gateway's backend over the elastic pool: requests go through PEARL's Router, control
events to the same handlers as the ZeroMQ API.

- ``generate`` sends one :class:`GenerateRequest` through a :class:`RolloutClient` (a turn
  aborted off a leaving worker resumes elsewhere with its prefix) and yields one :class:`Delta`
  per attempt that generated tokens, as each attempt ends: a stream keeps flowing across a
  migration. A delta's ``recomputed_tokens`` and ``migrations`` count what happened since the
  previous delta, so their sums are the request's totals. The session is the request's
  ``trajectory``: the Router's affinity keeps a session's turns on the worker holding its prefix.
  Generation stops at the request's stop ids (the gateway adds the tokenizer's eos unless the
  request ignores it). A stream closed before its end aborts the request in the pool.
- Sessions are measured as trajectories (:mod:`pearl.gateway.sessions`); each rollout step they
  make goes to the Runtime Tracker, as the Pipeline Scheduler's do.
- ``status`` is the Orchestrator's status (``pearl status --json``); ``event`` builds the record
  of one of :data:`pearl.core.events.ELASTIC_EVENTS` from its kind and fields and hands it to the
  ElasticScheduler: a bad kind or body is a 400, an event the scheduler refuses a 409 with its
  message. A training event without a ``step`` gets the one ``pearl event`` would send, and
  ``training-begin`` answers once training may proceed (``may_proceed_s``), as ``pearl event``
  does, unless asked not to wait.
- ``serving`` (``/health``) reads the routable workers from the table's last change; before
  one is heard, or while none is routable, the Orchestrator's status says why.
- Registered as :data:`actors.names.GATEWAY`, it hears the table's changes: a training step's
  begin, however the trainer sent it, is a step boundary for the sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec

from actors import names
from actors.base import Directory
from actors.messages import StateChanged
from actors.rollout_client import Attempt, Completion, RolloutClient
from pearl.config import Config
from pearl.core import events as ev
from pearl.core.bounds import event_fault
from pearl.core.errors import LogWriteFailed, NoWorker, PearlError, RequestRefused
from pearl.core.state import TrainingPhase
from pearl.core.status import status_plain
from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams
from pearl.gateway.backend import Delta, GatewayError, Sampling
from pearl.gateway.protocol import bad_text
from pearl.gateway.sessions import SessionBook
from pearl.tokenizer import Tokenizer

ASK_S = 30.0  # an event or a status answered by pearld's actors
RETURN_WAIT_S = 60.0  # training-begin: borrowed GPUs back within this, or a 504 (as pearl event)
HEALTH_ASK_S = 5.0  # /health's status: a probe does not wait long
STEP_EVENTS = frozenset({"training-begin", "training-finished"})  # a step by default
EVENTS: dict[str, type[ev.ElasticEvent]] = {t.KIND: t for t in ev.ELASTIC_EVENTS}


def model_dir(cfg: Config) -> Path | None:
    """The directory of the tokenizer the workers serve with, where one is named: a vLLM
    server's ``tokenizer`` or ``model_path``, an SGLang server's ``model_path`` (not the
    facade's ``sim``), else the torch preset when it is a directory. None: the preset's own
    (byte-level) tokenizer."""
    e = cfg.engine
    kind = str(getattr(e.kind, "value", e.kind))
    named = {"vllm": e.vllm.tokenizer or e.vllm.model_path, "sglang": e.sglang.model_path}
    for where in (named.get(kind, ""), str(e.torch.preset)):
        if where and where != "sim" and "/" in where and Path(where).is_dir():
            return Path(where)
    return None


def load_chat_template(directory: Path | None) -> str | None:
    """The chat template of a model directory's ``tokenizer_config.json`` (the default one when
    it lists several), or None."""
    if directory is None:
        return None
    path = directory / "tokenizer_config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    template = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default", next(iter(named.values()), None))
    return template if isinstance(template, str) else None


def served_model(cfg: Config) -> str:
    """The model id the gateway serves: ``gateway.model``, else the engine preset's name."""
    if cfg.gateway.model:
        return str(cfg.gateway.model)
    return Path(str(cfg.engine.torch.preset)).name or str(cfg.engine.torch.preset)


def served_vocab(cfg: Config, tokenizer: Any) -> int:
    """The vocabulary of the model the workers serve, which every token id of a request must be
    below: sim (or the facade serving it), ``engine.sim.vocab`` else the sim's own; vLLM and
    SGLang, their model directory's ``config.json``; without one (and torch), the preset's, or
    its directory's. Where none says, the tokenizer's, else 2**63 (what a worker host can be
    sent)."""
    e = cfg.engine
    kind = str(getattr(e.kind, "value", e.kind))
    servers = {"vllm": e.vllm.model_path, "sglang": e.sglang.model_path}
    # A server engine's model path "sim" is the facade serving the sim engine's cost model.
    if kind == "sim" or servers.get(kind) == "sim":
        from pearl.engines.sim import SimCost

        return int(e.sim.vocab) or SimCost.vocab_size
    preset = str(e.torch.preset)
    directory = str(servers.get(kind) or (preset if "/" in preset else ""))
    if not directory:
        from pearl.engines.torch.model import PRESETS

        if preset in PRESETS:
            return int(PRESETS[preset]["vocab_size"])
    if directory:
        try:
            raw = json.loads((Path(directory) / "config.json").read_text())
        except (OSError, ValueError):
            raw = {}
        if isinstance(raw, dict):
            text = raw.get("text_config")
            for where in (raw, text if isinstance(text, dict) else {}):
                if isinstance(where.get("vocab_size"), int) and where["vocab_size"] > 0:
                    return int(where["vocab_size"])
    vocab = getattr(tokenizer, "vocab_size", 0)
    return int(vocab) if isinstance(vocab, int) and vocab > 0 else 1 << 63


def finish_of(reason: FinishReason | None) -> str:
    return "stop" if reason is FinishReason.STOP else "length"


class PoolBackend:
    """:class:`pearl.gateway.backend.GatewayBackend` over the elastic pool of the pearld whose
    actors are in ``directory`` (see the module)."""

    def __init__(
        self,
        directory: Directory,
        cfg: Config,
        tokenizer: Tokenizer | None = None,
        *,
        chat_template: str | None = None,
        sessions_per_step: int = 8,
        session_idle_s: float = 60.0,
        name: str = "gateway-client",
    ) -> None:
        if tokenizer is None:
            from pearl.tokenizer import load_tokenizer

            where = model_dir(cfg)
            tokenizer = load_tokenizer(where)
            chat_template = chat_template or load_chat_template(where)
        self.directory, self.cfg = directory, cfg
        self.tokenizer: Tokenizer = tokenizer
        self.chat_template = chat_template
        self.model = served_model(cfg)
        self.max_context = int(cfg.workload.max_trajectory_tokens)
        self.vocab_size = served_vocab(cfg, tokenizer)
        self.client = RolloutClient(directory, name, wait_s=float(cfg.gateway.request_timeout_s))
        self.sessions = SessionBook(sessions_per_step, session_idle_s)
        self._lock = threading.Lock()  # guards the session book (Router thread + event loop)
        self._boundary_step: int | None = None  # the training step whose begin ended sessions
        self._routable: int | None = None  # routable workers the table last said (None: unheard)
        self._routable_seq = -1  # the log sequence number that said it
        self.name = names.GATEWAY
        directory.register(self)  # hears the table's changes: a trainer's step boundaries

    def close(self) -> None:
        self.directory.unregister(self.name, self)
        self.client.close()

    # -- the table's changes (the Orchestrator tells its listeners) -----------------------------

    def tell(self, msg: Any) -> None:
        """A training step began (whichever way the trainer sent ``training-begin``: ZeroMQ,
        the embedded Runtime, or this gateway): a step boundary for the sessions."""
        if not isinstance(msg, StateChanged):
            return
        self._routable, self._routable_seq = len(msg.view.routable), msg.seq
        t = msg.view.table
        if t.phase is not TrainingPhase.TRAINING or t.training_step == self._boundary_step:
            return
        self._boundary_step = t.training_step
        with self._lock:
            self.sessions.boundary()
        self._report()

    def ask(self, msg: Any, timeout_s: float = 0.0) -> None:
        self.tell(msg)

    # -- generation -----------------------------------------------------------------------------

    async def generate(
        self, rid: str, prompt_ids: Sequence[int], sampling: Sampling, session: str
    ) -> AsyncIterator[Delta]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Attempt | Future[Completion]] = asyncio.Queue()

        def put(item: Attempt | Future[Completion]) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens any more
                loop.call_soon_threadsafe(queue.put_nowait, item)

        params = SamplingParams(
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            stop_ids=tuple(sampling.stop_ids),
            seed=sampling.seed,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            repetition_penalty=sampling.repetition_penalty,
            min_tokens=sampling.min_tokens,
            logit_bias=sampling.logit_bias,
            grammar=sampling.grammar,
        )
        request = GenerateRequest(
            rid=rid, input_ids=tuple(prompt_ids), sampling=params, trajectory=session,
            top_logprobs=sampling.top_logprobs, group=sampling.group,
        )  # fmt: skip
        with self._lock:
            key = self.sessions.begin(session, len(prompt_ids))

        def on_attempt(a: Attempt) -> None:  # the Router's thread
            with self._lock:
                self.sessions.attempt(
                    key=key, worker=a.worker, generated=len(a.output_ids),
                    prompt_tokens=a.prompt_tokens, cached_tokens=a.cached_tokens,
                    decode_steps=a.decode_steps, decode_batch_sum=a.decode_batch_sum,
                )  # fmt: skip
            put(a)

        generated, ended = 0, False

        def end() -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            with self._lock:
                self.sessions.end(key, len(prompt_ids), generated)
            self._report()

        try:
            future = self.client.generate(request, on_attempt)
        except PearlError as e:  # already in flight
            end()
            raise GatewayError(str(e), 409, "invalid_request_error") from None
        future.add_done_callback(put)
        moved = recomputed = 0  # since the previous delta
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Attempt):
                    recomputed += item.recomputed_tokens
                    if not item.output_ids and item.finish_reason is None:
                        continue
                    generated += len(item.output_ids)
                    last = item.finish_reason is not None
                    delta = Delta(
                        token_ids=item.output_ids,
                        logprobs=item.logprobs,
                        weight_version=item.weights_version,
                        finish_reason=finish_of(item.finish_reason) if last else None,
                        recomputed_tokens=recomputed,
                        migrations=item.resumed - moved,
                        top_logprobs=item.top_logprobs,
                    )
                    moved, recomputed = item.resumed, 0
                    if last:
                        end()  # measured before the caller sees the end
                    yield delta
                    if last:
                        return
                    continue
                error = item.exception()
                if isinstance(error, RequestRefused):  # the request's fault: the server's reason
                    raise GatewayError(str(error), 400, "invalid_request_error")
                if isinstance(error, NoWorker):
                    raise GatewayError(
                        f"{error}; try again later",
                        503, "server_error", retry_after_s=error.retry_after_s,
                    )  # fmt: skip
                if error is not None:
                    raise GatewayError(
                        f"the pool gave up on request {rid}: {error}", 503, "server_error"
                    )
                done = item.result()  # settled without a final attempt (cannot happen today)
                end()
                yield Delta(
                    token_ids=(),
                    logprobs=(),
                    weight_version=0,
                    finish_reason=finish_of(done.finish_reason),
                    recomputed_tokens=recomputed,
                    migrations=0,
                )
                return
        finally:
            if not ended:  # the caller went away, or the pool gave up
                self.client.cancel(rid)
                end()

    def _report(self) -> None:
        """Hand the Runtime Tracker every rollout step the sessions made."""
        while True:
            with self._lock:
                step = self.sessions.take_step()
            if step is None:
                return
            self.directory.tell(names.TRACKER, step)

    # -- control --------------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._status)

    def _status(self) -> dict[str, Any]:
        from transports.protocol import StatusRequest

        status = self.directory.get(names.ORCHESTRATOR).ask(StatusRequest(), ASK_S)
        return status_plain(status)

    async def serving(self) -> str | None:
        """None while the table has a routable worker (as its last change, or the last status,
        said); else, or before either was heard, the Orchestrator's status says why none
        serves."""
        if self._routable:
            return None
        return await asyncio.to_thread(self._why_not_serving)

    def _why_not_serving(self) -> str | None:
        from transports.protocol import StatusRequest

        status = self.directory.get(names.ORCHESTRATOR).ask(StatusRequest(), HEALTH_ASK_S)
        rollout = [w for w in status.workers if w.role != "training"]
        active = sum(w.activity == "active" for w in rollout)
        if int(status.seq) >= self._routable_seq:  # not older than the last change heard
            self._routable, self._routable_seq = active, int(status.seq)
        if active:
            return None
        if not rollout:
            return "the pool has no rollout worker (no GPUs for rollout yet)"
        counts = Counter(str(w.activity) for w in rollout)
        states = ", ".join(f"{n} {a}" for a, n in sorted(counts.items()))
        return f"no rollout worker is active yet ({states})"

    async def event(self, kind: str, body: dict[str, Any], wait: bool = True) -> dict[str, Any]:
        if kind in STEP_EVENTS and isinstance(body, dict) and "step" not in body:
            body = {**body, "step": await asyncio.to_thread(self._default_step, kind)}
        record = self.record(kind, body)
        t0 = time.monotonic()
        seq = await asyncio.to_thread(self._event, record)
        out: dict[str, Any] = {"kind": kind, "seq": seq}
        if wait and isinstance(record, ev.TrainingBegin):
            out["may_proceed_s"] = await asyncio.to_thread(self._may_proceed, record.step, t0)
        return out

    def _may_proceed(self, step: int, t0: float) -> float:
        """Seconds from ``t0`` until training ``step`` may proceed; 504 past RETURN_WAIT_S."""
        from pearl.runtime import TrainingTimeout, wait_training_may_proceed
        from transports.protocol import StatusRequest

        orchestrator = self.directory.get(names.ORCHESTRATOR)
        try:
            return wait_training_may_proceed(
                lambda: orchestrator.ask(StatusRequest(), ASK_S), step, RETURN_WAIT_S, since=t0
            )
        except TrainingTimeout as e:
            raise GatewayError(f"{e}; the event is logged", 504, "server_error") from None

    @staticmethod
    def record(kind: str, body: dict[str, Any]) -> ev.ElasticEvent:
        """The elastic event ``kind`` with ``body``'s fields; GatewayError 400 when either is
        wrong."""
        cls = EVENTS.get(kind)
        if cls is None:
            raise GatewayError(
                f"unknown event kind {kind!r}; expected one of {sorted(EVENTS)}", param="kind"
            )
        if not isinstance(body, dict):
            raise GatewayError(f"{kind}: the body must be a JSON object of its fields")
        where = bad_text(body)
        if where is not None:
            raise GatewayError(
                f"{kind}: {where or 'a key of the body'} is not valid Unicode text "
                "(a lone surrogate such as \\ud800)",
                param=where or None,
            )
        fields = {k: v for k, v in body.items() if k != "kind"}
        if body.get("kind", kind) != kind:
            raise GatewayError(
                f"{kind}: the body names another kind, {body['kind']!r}", param="kind"
            )
        try:
            record = msgspec.convert(fields, cls)
        except msgspec.ValidationError as e:
            at = re.search(r"at `\$\.(\w+)", str(e))  # msgspec names the field: `$.gpus[0]`
            raise GatewayError(f"{kind}: {e}", param=at[1] if at else None) from None
        fault = event_fault(record)  # out of bounds, or a GPU event naming no GPU: 400 too
        if fault is not None:
            raise GatewayError(f"{kind}: {fault[1]}; nothing was logged", param=fault[0])
        return record

    def _default_step(self, kind: str) -> int:
        """A training event's step when the body names none, as ``pearl event`` picks it: the
        next step for ``training-begin``, the current one for ``training-finished``."""
        from transports.protocol import StatusRequest

        status = self.directory.get(names.ORCHESTRATOR).ask(StatusRequest(), ASK_S)
        return int(status.training_step) + (1 if kind == "training-begin" else 0)

    def _event(self, record: ev.ElasticEvent) -> int:
        try:
            ack = self.directory.get(names.SCHEDULER).ask(record, ASK_S)
        except LogWriteFailed as e:
            # The disk refused the record (full, I/O error): nothing was logged, and the same
            # event is accepted once the disk takes writes again; pearld retries it every tick.
            retry = max(1.0, self.cfg.daemon.tick_s)
            raise GatewayError(str(e), 503, "server_error", retry_after_s=retry) from None
        except PearlError as e:
            raise GatewayError(str(e), 409, "invalid_request_error") from None
        return int(getattr(ack, "seq", 0))


__all__ = ["PoolBackend", "load_chat_template", "model_dir", "served_model", "served_vocab"]
