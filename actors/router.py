"""The Router: the Pipeline Scheduler's dispatch (§4.1.1). Routes only to active workers.

Its view of the workers changes only when the Orchestrator publishes a logged change. A request
goes to the least-loaded colocated worker, or, under disaggregation, to a prefill and a decode
worker together with a fresh transfer id (SGLang's shape); the decode worker's answer is the
result. A request with nowhere to go waits until workers are routable again; a retryable failure
(the KV never arrived, the worker was leaving) is routed again; an aborted request comes back with
its generated prefix to whoever asked, who resubmits it.

With ``engine.router = "sglang-router"`` the Router keeps its bookkeeping (pending requests,
retries, replies) but hands dispatch to an :class:`~pearl.engines.sglang.router.SGLangRouterLink`:
the link registers the committed workers with the real sglang-router and sends requests through
it; its answers come back here as ``generate-done`` from worker ``LINK``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from actors.base import Directory, PearlActor
from actors.messages import AbortRequest, Generate, GenerateDone, Route, StateChanged
from pearl.engines.base import GenerateRequest

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
LINK = -1  # the "worker" a request runs on when the real sglang-router dispatches it


@dataclass(frozen=True)
class LinkChanged:
    """The sglang-router link admitted or removed workers: waiting requests may go now."""


@dataclass(frozen=True)
class KvAddress:
    """Where a worker's KV inbox listens (told by the RoleSupervisor on hello)."""

    worker: int
    address: str


@dataclass(frozen=True)
class Flush:
    """Sent every daemon tick."""


@dataclass
class Pending:
    route: Route
    attempt: int = 0
    workers: tuple[int, ...] = ()  # where it runs now; the last one answers
    original: GenerateRequest | None = None


@dataclass
class View:
    colocated: list[int] = field(default_factory=list)
    prefill: list[int] = field(default_factory=list)
    decode: list[int] = field(default_factory=list)


class Router(PearlActor):
    name = "router"
    handles = {
        StateChanged: "state_changed",
        KvAddress: "kv_address",
        Route: "route",
        GenerateDone: "done",
        AbortRequest: "abort",
        LinkChanged: "link_changed",
        Flush: "flush",
    }

    def __init__(self, directory: Directory, link: Any = None) -> None:
        super().__init__()
        self.directory = directory
        self.link = link  # an SGLangRouterLink, or None: PEARL dispatches to workers itself
        self.view = View()
        self.kv: dict[int, str] = {}
        self.load: dict[int, int] = {}
        self.pending: dict[str, Pending] = {}
        self.waiting: deque[str] = deque()
        self.seq = 0

    def state_changed(self, msg: StateChanged) -> None:
        v = View()
        for w in msg.status["workers"]:
            if w["activity"] == "active" and w["role"] != "training":
                getattr(v, w["role"]).append(w["id"])
        self.view, self.seq = v, msg.seq
        if self.link is not None:
            self.link.update(msg.status)  # registers in the background, then LinkChanged
        self._flush()

    def on_start(self) -> None:
        if self.link is not None:
            self.link.on_change = lambda: self.actor_ref.tell(LinkChanged())

    def on_stop(self) -> None:
        if self.link is not None:
            self.link.close()

    def link_changed(self, _: LinkChanged) -> None:
        self._flush()

    def kv_address(self, msg: KvAddress) -> None:
        self.kv[msg.worker] = msg.address

    def route(self, msg: Route) -> None:
        rid = msg.request.rid
        if rid in self.pending:
            self._reply(
                msg.reply_to, GenerateDone(-1, rid, None, f"request {rid} is already in flight")
            )
            return
        self.pending[rid] = Pending(msg, original=msg.request)
        self._dispatch(rid)

    def _pick(self, pool: list[int]) -> int:
        return min(pool, key=lambda w: (self.load.get(w, 0), w))

    def _dispatch(self, rid: str) -> None:
        p = self.pending[rid]
        req = p.original
        assert req is not None
        v = self.view
        if self.link is not None:
            self._dispatch_link(rid, p, req)
            return
        if v.colocated:
            w = self._pick(v.colocated)
            p.workers = (w,)
            self._send(w, req)
        elif v.prefill and v.decode and all(d in self.kv for d in v.decode):
            pw, dw = self._pick(v.prefill), self._pick(v.decode)
            transfer = f"{rid}#{p.attempt}"
            p.workers = (pw, dw)
            self._send(dw, dataclasses.replace(req, transfer_id=transfer, kv_peer=""))
            self._send(pw, dataclasses.replace(req, transfer_id=transfer, kv_peer=self.kv[dw]))
        else:
            p.workers = ()
            self.waiting.append(rid)

    def _dispatch_link(self, rid: str, p: Pending, req: GenerateRequest) -> None:
        if not self.link.routable():
            p.workers = ()
            self.waiting.append(rid)
            return
        p.workers = (LINK,)
        me = self.actor_ref

        def done(result: Any, error: str, retryable: bool) -> None:
            me.tell(GenerateDone(LINK, rid, result, error, retryable))

        self.link.submit(req, done)

    def _send(self, worker: int, req: GenerateRequest) -> None:
        self.load[worker] = self.load.get(worker, 0) + 1
        if not self.directory.tell(f"worker/{worker}", Generate(req)):
            self.directory.tell(
                self.name, GenerateDone(worker, req.rid, None, "worker unreachable", True)
            )

    def flush(self, _: Any = None) -> None:
        """Periodic: route what waits (requests to retry, requests with nowhere to go)."""
        self._flush()

    def _flush(self) -> None:
        for _ in range(len(self.waiting)):
            rid = self.waiting.popleft()
            if rid in self.pending:
                self._dispatch(rid)

    def done(self, msg: GenerateDone) -> None:
        self.load[msg.worker] = max(0, self.load.get(msg.worker, 0) - 1)
        p = self.pending.get(msg.rid)
        if p is None or not p.workers or msg.worker != p.workers[-1]:
            return  # the prefill side of a PD request, or a stale answer
        if msg.error and msg.retryable and p.attempt + 1 < MAX_ATTEMPTS:
            # Routed again at the next flush (a tick, or a logged change): a worker that just
            # vanished gets a moment to be restarted or replaced instead of eating the retries.
            p.attempt += 1
            p.workers = ()
            log.info("routing %s again (attempt %d): %s", msg.rid, p.attempt + 1, msg.error)
            self.waiting.append(msg.rid)
            return
        del self.pending[msg.rid]
        self._reply(p.route.reply_to, msg)

    def abort(self, msg: AbortRequest) -> None:
        p = self.pending.get(msg.rid)
        if p is None:
            return
        for w in p.workers:
            if w == LINK:
                self.link.abort(msg.rid)
            else:
                self.directory.tell(f"worker/{w}", msg)
        if not p.workers:  # still waiting for a worker: answer now
            del self.pending[msg.rid]
            self._reply(p.route.reply_to, GenerateDone(-1, msg.rid, None, "aborted before it ran"))

    def _reply(self, to: str, msg: GenerateDone) -> None:
        if not self.directory.tell(to, msg):
            log.warning("nobody named %s to hear about %s", to, msg.rid)

    def stats(self, _: Any = None) -> dict[str, Any]:
        return {"pending": len(self.pending), "waiting": len(self.waiting), "load": dict(self.load)}


__all__ = ["LINK", "KvAddress", "LinkChanged", "Router"]
