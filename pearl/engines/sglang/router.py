"""PEARL's side of the real ``sglang-router``: worker registration as plans commit, and dispatch.

The router's mode is fixed at launch (regular or ``--pd-disaggregation``; its gateway mode needs
network access at start), while PEARL moves between colocation and disaggregation, so PEARL runs
two routers: one regular, one PD. :class:`SGLangRouterLink`

- registers and removes workers through ``POST /workers {url, worker_type, bootstrap_port}`` /
  ``DELETE /workers/{id}`` when the Orchestrator publishes a logged change: leaving workers are
  removed at once, a group of joining workers is admitted only when every one of them answers
  ``/health`` (and the router reports it healthy);
- sends each request to the router of the current mode (the regular one while any colocated worker
  is registered, else the PD one, which adds the bootstrap fields itself) from a thread pool, and
  answers through a callback; a request that no router can take yet (503) is retryable;
- aborts by posting ``/abort_request`` to every registered worker (the router has no abort route).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pearl.config import EngineConfig, RouterKind, SGLangConfig
from pearl.core.state import Role, Worker
from pearl.engines.base import EngineError, GenerateRequest, GenerateResult
from pearl.engines.sglang import protocol as P
from pearl.engines.sglang.client import SGLangClient
from pearl.engines.sglang.launch import ServerProcess, worker_ports
from pearl.engines.web import HTTPError, call

log = logging.getLogger(__name__)
TYPES = {Role.COLOCATED: "regular", Role.PREFILL: "prefill", Role.DECODE: "decode"}
Done = Callable[[GenerateResult | None, str, bool], None]  # (result, error, retryable)


@dataclass(frozen=True)
class WorkerEndpoint:
    worker: int
    url: str
    worker_type: str  # regular | prefill | decode
    bootstrap_port: int | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url, "worker_type": self.worker_type}
        if self.bootstrap_port is not None:
            out["bootstrap_port"] = self.bootstrap_port
        return out


def endpoints_of(workers: Iterable[Worker], cfg: SGLangConfig) -> dict[str, WorkerEndpoint]:
    """The routable ones of ``workers`` (table rows), by server URL."""
    out: dict[str, WorkerEndpoint] = {}
    for w in workers:
        if not w.routable or w.role not in TYPES or not w.gpus:
            continue
        port, boot = worker_ports(cfg, min(w.gpus))
        url = f"http://{cfg.host}:{port}"
        kind = TYPES[w.role]
        out[url] = WorkerEndpoint(
            worker=w.id,
            url=url,
            worker_type=kind,
            bootstrap_port=boot if kind == "prefill" else None,
        )
    return out


class SGLangRouterClient:
    """One running sglang-router."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def workers(self) -> list[dict[str, Any]]:
        return list(
            (
                call(
                    url=self.url + "/workers", method="GET", payload=None, timeout_s=self.timeout_s
                )
                or {}
            )["workers"]
        )

    def add(self, ep: WorkerEndpoint) -> str:
        out = call(
            url=self.url + "/workers", method="POST", payload=ep.body(), timeout_s=self.timeout_s
        )
        return str(out.get("worker_id", ""))

    def remove(self, worker_id: str) -> None:
        call(
            url=f"{self.url}/workers/{worker_id}",
            method="DELETE",
            payload=None,
            timeout_s=self.timeout_s,
        )

    def generate(self, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        return dict(
            call(url=self.url + "/generate", method="POST", payload=body, timeout_s=timeout_s)
        )


class SGLangRouterLink:
    """Registration and dispatch through a regular and a PD sglang-router (see module doc)."""

    def __init__(
        self,
        regular_url: str,
        pd_url: str,
        cfg: SGLangConfig,
        *,
        on_change: Callable[[], None] | None = None,
        request_timeout_s: float = 3600.0,
        admit_timeout_s: float = 30.0,
        processes: tuple[ServerProcess, ...] = (),
    ) -> None:
        self.routers = {
            "regular": SGLangRouterClient(regular_url),
            "pd": SGLangRouterClient(pd_url),
        }
        self.cfg, self.on_change = cfg, on_change
        self.request_timeout_s, self.admit_timeout_s = request_timeout_s, admit_timeout_s
        self.processes = processes
        self.registered: dict[str, WorkerEndpoint] = {}  # url -> endpoint, as the routers hold
        self._desired: dict[str, WorkerEndpoint] | None = None
        self._lock = threading.Condition()
        self._closed = False
        self._pool = ThreadPoolExecutor(256, thread_name_prefix="sglang-router-req")
        self._syncer = threading.Thread(target=self._sync_loop, name="router-sync", daemon=True)
        self._syncer.start()

    # -- registration --------------------------------------------------------------------------

    def update(self, routable: Iterable[Worker]) -> None:
        """A logged change: converge the routers on its routable workers (in the background)."""
        with self._lock:
            self._desired = endpoints_of(routable, self.cfg)
            self._lock.notify_all()

    def _sync_loop(self) -> None:
        while True:
            with self._lock:
                while self._desired is None and not self._closed:
                    self._lock.wait(0.5)
                if self._closed:
                    return
                desired, self._desired = self._desired, None
            assert desired is not None
            try:
                done = self.sync(desired)
            except EngineError as e:
                log.warning("sglang-router sync failed (will retry): %s", e)
                done = False
            if not done:
                time.sleep(0.2)
                with self._lock:  # retry unless a newer change superseded this one
                    if self._desired is None:
                        self._desired = desired

    def sync(self, desired: dict[str, WorkerEndpoint]) -> bool:
        """Remove what left, then admit what joined if all of it is healthy. True when done."""
        held = {(name, w["url"]): w for name, r in self.routers.items() for w in r.workers()}
        keep: dict[str, WorkerEndpoint] = {}
        for (name, url), w in held.items():
            want = desired.get(url)
            if want is None or want.worker_type != w["worker_type"]:
                self.routers[name].remove(w["id"])
                log.info("sglang-router %s: removed %s (%s)", name, url, w["worker_type"])
            else:
                keep[url] = want
        with self._lock:
            self.registered = keep
        joining = [e for u, e in desired.items() if u not in keep]
        changed = len(keep) < len(held)
        if joining:
            sick = [e.url for e in joining if not SGLangClient(e.url).health(2.0)]
            if sick:  # all-or-nothing admission of the group
                log.info(
                    "sglang-router: waiting for %s before admitting %d workers", sick, len(joining)
                )
                self._notify(changed)
                return False
            for e in joining:
                self._router_for(e.worker_type).add(e)
            self._await_healthy(joining)
            with self._lock:
                self.registered.update({e.url: e for e in joining})
            changed = True
        self._notify(changed)
        return True

    def _router_for(self, worker_type: str) -> SGLangRouterClient:
        return self.routers["regular" if worker_type == "regular" else "pd"]

    def _await_healthy(self, joining: list[WorkerEndpoint]) -> None:
        deadline = time.monotonic() + self.admit_timeout_s
        want = {e.url for e in joining}
        while time.monotonic() < deadline:
            healthy = {
                w["url"]
                for r in self.routers.values()
                for w in r.workers()
                if w.get("is_healthy", True)
            }
            if want <= healthy:
                return
            time.sleep(0.05)
        raise EngineError(
            f"sglang-router did not report {sorted(want)} healthy within "
            f"{self.admit_timeout_s:.0f}s"
        )

    def _notify(self, changed: bool) -> None:
        if changed and self.on_change is not None:
            self.on_change()

    # -- dispatch ------------------------------------------------------------------------------

    def mode(self) -> str | None:
        """The router requests go to now: regular, pd, or None (nothing routable)."""
        with self._lock:
            kinds = {e.worker_type for e in self.registered.values()}
        if "regular" in kinds:
            return "regular"
        return "pd" if {"prefill", "decode"} <= kinds else None

    def routable(self) -> bool:
        return self.mode() is not None

    def submit(self, req: GenerateRequest, done: Done) -> None:
        """Run ``req`` through the router of the current mode; ``done`` gets the outcome."""
        mode = self.mode()
        if mode is None:
            done(None, "no worker is registered with the sglang-router", True)
            return
        self._pool.submit(self._run, req, mode, done)

    def _run(self, req: GenerateRequest, mode: str, done: Done) -> None:
        role = Role.COLOCATED if mode == "regular" else Role.DECODE
        try:
            out = self.routers[mode].generate(P.generate_body(req), self.request_timeout_s)
            done(P.result_of(rid=req.rid, body=out, role=role, version=0), "", False)
        except HTTPError as e:  # no worker yet, a worker left mid-request: route it again
            done(None, str(e), e.status >= 500 or e.status == 404)
        except EngineError as e:
            done(None, str(e), True)

    def abort(self, rid: str) -> None:
        """Abort ``rid`` wherever it runs (the routers forward no aborts)."""
        with self._lock:
            urls = list(self.registered)
        for url in urls:
            try:
                SGLangClient(url, timeout_s=5.0).abort(P.wire_rid(rid))
            except EngineError as e:
                log.debug("abort %s at %s: %s", rid, url, e)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in self.processes:
            p.stop()


def launch_router(
    host: str, port: int, python: str = "", pd: bool = False, deadline: float | None = None
) -> ServerProcess:
    """One sglang-router on ``port`` (metrics on ``port + 10``), regular or PD (``pd``), once it
    answers ``/workers``; EngineError when it does not by ``deadline`` (60 s from now)."""
    import sys

    argv = [
        python or sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-port",
        str(port + 10),
        "--log-level",
        "warn",
        *(["--pd-disaggregation"] if pd else []),
    ]
    proc = ServerProcess(argv)
    deadline = time.monotonic() + 60.0 if deadline is None else deadline
    while True:
        try:
            call(url=f"http://{host}:{port}/workers", method="GET", payload=None, timeout_s=2.0)
            return proc
        except EngineError:
            if not proc.alive() or time.monotonic() > deadline:
                proc.stop()
                raise EngineError(
                    f"sglang-router on port {port} did not start:\n{proc.tail()}"
                ) from None
            time.sleep(0.1)


def launch_routers(host: str, port: int, python: str = "") -> tuple[ServerProcess, ...]:
    """A regular router on ``port`` and a PD router on ``port + 1`` (metrics on +10, +11)."""
    deadline = time.monotonic() + 60.0
    regular = launch_router(host, port, python, deadline=deadline)
    try:
        return regular, launch_router(host, port + 1, python, pd=True, deadline=deadline)
    except EngineError:
        regular.stop()
        raise


def link_from_config(
    engine: EngineConfig,
    on_change: Callable[[], None] | None = None,
) -> SGLangRouterLink | None:
    """The link for ``engine.router = 'sglang-router'`` (launching both routers unless
    ``engine.sglang.router_urls`` names running ones); None for PEARL's own Router."""
    if engine.router is not RouterKind.SGLANG_ROUTER:
        return None
    cfg = engine.sglang
    if cfg.router_urls:
        regular, pd = (u.strip() for u in cfg.router_urls.split(","))
        return SGLangRouterLink(regular, pd, cfg, on_change=on_change)
    procs = launch_routers(cfg.host, cfg.router_port)
    base = f"http://{cfg.host}:"
    return SGLangRouterLink(
        base + str(cfg.router_port),
        base + str(cfg.router_port + 1),
        cfg,
        on_change=on_change,
        processes=procs,
    )


__all__ = [
    "SGLangRouterClient",
    "SGLangRouterLink",
    "WorkerEndpoint",
    "endpoints_of",
    "launch_router",
    "launch_routers",
    "link_from_config",
]
