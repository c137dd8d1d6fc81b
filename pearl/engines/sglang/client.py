"""One HTTP client for SGLang servers (and the torch engine's SGLang-compatible facade).

Standard library only (``http.client``; one connection per call, so every method is thread-safe).
:meth:`SGLangClient.detect` probes the server generation once (``/server_info``, else the older
``/get_server_info``), reads its version, and later calls use the matching paths and features.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pearl.core.errors import RequestRefused
from pearl.engines.base import EngineError
from pearl.engines.sglang import protocol as P
from pearl.engines.web import HTTPError, call, request


@dataclass
class ServerInfo:
    """What :meth:`SGLangClient.detect` learned about a server."""

    version: str
    endpoints: P.Endpoints
    mode: str  # disaggregation mode: null | prefill | decode
    role_switch: bool  # /pd_role_switch is served (0.5.21+, flag on, PD mode)
    raw: dict[str, Any] = field(default_factory=dict)


class SGLangClient:
    """Drives one server at ``base_url`` (``http://host:port``)."""

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.base = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.info: ServerInfo | None = None
        self._lock = threading.Lock()

    def _url(self, path: str) -> str:
        return self.base + path

    def get(self, path: str, timeout_s: float | None = None) -> Any:
        return call(
            url=self._url(path), method="GET", payload=None, timeout_s=timeout_s or self.timeout_s
        )

    def post(self, path: str, payload: object = None, timeout_s: float | None = None) -> Any:
        return call(
            url=self._url(path),
            method="POST",
            payload={} if payload is None else payload,
            timeout_s=timeout_s or self.timeout_s,
        )

    # -- liveness and identity -----------------------------------------------------------------

    def health(self, timeout_s: float = 5.0) -> bool:
        try:
            status, _ = request(
                url=self._url("/health"), method="GET", payload=None, timeout_s=timeout_s
            )
        except EngineError:
            return False
        return status == 200

    def wait_healthy(
        self, timeout_s: float, alive: Callable[[], bool] | None = None, poll_s: float = 0.2
    ) -> None:
        """Block until ``/health`` answers 200; ``alive()`` False (the process died) fails fast."""
        deadline = time.monotonic() + timeout_s
        while not self.health():
            if alive is not None and not alive():
                raise EngineError(f"SGLang server {self.base} exited before it became healthy")
            if time.monotonic() > deadline:
                raise EngineError(f"SGLang server {self.base} not healthy within {timeout_s:.0f}s")
            time.sleep(poll_s)

    def detect(self) -> ServerInfo:
        """Probe the server generation and version (cached until :meth:`forget`)."""
        with self._lock:
            if self.info is not None:
                return self.info
            endpoints = P.Endpoints()
            status, raw = request(
                url=self._url(endpoints.server_info),
                method="GET",
                payload=None,
                timeout_s=self.timeout_s,
            )
            if status == 404:
                endpoints = P.Endpoints.legacy()
                raw = call(
                    url=self._url(endpoints.server_info),
                    method="GET",
                    payload=None,
                    timeout_s=self.timeout_s,
                )
            elif not 200 <= status < 300:
                raise HTTPError(
                    method="GET", url=self._url(endpoints.server_info), status=status, body=raw
                )
            raw = raw if isinstance(raw, dict) else {}
            version = str(raw.get("version", "0"))
            mode = str(raw.get("disaggregation_mode", "null"))
            switch = (
                P.supports_role_switch(version)
                and bool(raw.get("enable_pd_role_switch"))
                and mode != "null"
            )
            self.info = ServerInfo(
                version=version, endpoints=endpoints, mode=mode, role_switch=switch, raw=raw
            )
            return self.info

    def forget(self) -> None:
        """Drop what :meth:`detect` learned (the server was restarted or switched role)."""
        with self._lock:
            self.info = None

    def server_info(self) -> dict[str, Any]:
        return dict(self.get(self.detect().endpoints.server_info) or {})

    def model_info(self) -> dict[str, Any]:
        return dict(self.get(self.detect().endpoints.model_info) or {})

    # -- requests ------------------------------------------------------------------------------

    def generate(self, body: dict[str, Any], timeout_s: float = 3600.0) -> dict[str, Any]:
        """One ``/generate``; a 4xx is :class:`RequestRefused` (the request's own fault, final)."""
        try:
            out = self.post("/generate", body, timeout_s)
        except HTTPError as e:
            if 400 <= e.status < 500:
                raise RequestRefused(
                    f"the SGLang server refused the request ({e.status}): {str(e.body)[:300]}"
                ) from None
            raise
        if not isinstance(out, dict):
            raise EngineError(f"{self.base}/generate answered {str(out)[:200]!r}, not JSON")
        if "error" in out and "output_ids" not in out:
            raise EngineError(f"{self.base}/generate failed: {out['error']}")
        return out

    def abort(self, rid: str) -> None:
        """Abort one request by its wire rid (its /generate call returns with the prefix)."""
        self.post("/abort_request", {"rid": rid})

    def abort_all(self) -> None:
        self.post("/abort_request", {"rid": "", "abort_all": True})

    # -- memory, weights, roles ----------------------------------------------------------------

    def release_memory(self, tags: tuple[str, ...] = P.MEMORY_TAGS) -> None:
        """``/release_memory_occupation``; the server must be idle (drain or abort first)."""
        self.post("/release_memory_occupation", {"tags": list(tags)}, 600.0)

    def resume_memory(self, tags: tuple[str, ...] = P.MEMORY_TAGS) -> None:
        self.post("/resume_memory_occupation", {"tags": list(tags)}, 600.0)

    def update_weights_from_disk(self, model_path: str, version: int) -> dict[str, Any]:
        out = self.post(
            "/update_weights_from_disk",
            {"model_path": model_path, "weight_version": str(version)},
            3600.0,
        )
        return _checked(out, "update_weights_from_disk")

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> dict[str, Any]:
        out = self.post(
            "/init_weights_update_group",
            {
                "master_address": master_address,
                "master_port": master_port,
                "rank_offset": rank_offset,
                "world_size": world_size,
                "group_name": group_name,
                "backend": backend,
            },
            600.0,
        )
        return _checked(out, "init_weights_update_group")

    def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        version: int,
        group_name: str = "weight_update_group",
    ) -> dict[str, Any]:
        """Receive a broadcast of ``names`` from rank 0 of the group (the trainer sends them)."""
        out = self.post(
            "/update_weights_from_distributed",
            {
                "names": names,
                "dtypes": dtypes,
                "shapes": shapes,
                "group_name": group_name,
                "flush_cache": True,
                "weight_version": str(version),
            },
            3600.0,
        )
        return _checked(out, "update_weights_from_distributed")

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        self.post("/destroy_weights_update_group", {"group_name": group_name})

    def pd_role_switch(self, new_role: str) -> dict[str, Any]:
        """Flip prefill <-> decode in place (0.5.21+, idle server); raises when refused."""
        try:
            out = self.post("/pd_role_switch", {"new_role": new_role}, 600.0)
        except HTTPError as e:
            raise EngineError(
                f"{self.base} refused /pd_role_switch to {new_role}: {_message(e.body)}"
            ) from None
        self.forget()
        return _checked(out, "pd_role_switch")

    def metrics(self) -> dict[str, float]:
        """``/metrics`` (servers launched with ``--enable-metrics``) summed over label sets."""
        status, body = request(
            url=self._url("/metrics"), method="GET", payload=None, timeout_s=self.timeout_s
        )
        if status != 200 or not isinstance(body, str):
            return {}
        return P.parse_metrics(body)


def _message(body: object) -> str:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(body.get("message", err or body))
    return str(body)


def _checked(out: object, what: str) -> dict[str, Any]:
    if isinstance(out, dict) and out.get("success") is False:
        raise EngineError(f"{what} failed: {out.get('message', out)}")
    return dict(out) if isinstance(out, dict) else {}


def generate_pd(
    prefill: SGLangClient,
    decode: SGLangClient,
    body: dict[str, Any],
    bootstrap_host: str,
    bootstrap_port: int,
    timeout_s: float = 3600.0,
) -> dict[str, Any]:
    """Disaggregated generation: the same body, with a fresh bootstrap room, to both servers at
    once; the decode server's answer is the result (a prefill failure is raised too)."""
    full = dict(body, **P.Bootstrap.fresh(bootstrap_host, bootstrap_port).fields())
    errors: list[BaseException] = []

    def run_prefill() -> None:
        try:
            prefill.generate(full, timeout_s)
        except BaseException as e:  # reported after the decode side answers
            errors.append(e)

    t = threading.Thread(target=run_prefill, name="pd-prefill", daemon=True)
    t.start()
    try:
        out = decode.generate(full, timeout_s)
    finally:
        t.join(timeout_s)
    if errors:
        raise EngineError(f"prefill side of {body.get('rid')} failed: {errors[0]}")
    return out


__all__ = ["HTTPError", "SGLangClient", "ServerInfo", "call", "generate_pd", "request"]
