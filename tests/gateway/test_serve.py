"""Serving the gateway: uvicorn on its own thread and loop, a taken port refused in one line, and
pearld refusing to start (its state directory untouched) when the gateway cannot listen."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from pearl import config
from pearl.core.errors import ConfigError
from pearl.daemon import Daemon
from pearl.gateway.backend import Sampling
from pearl.gateway.serve import GatewayBindFailed, GatewayServer, read_api_key
from tests.gateway.test_pool import scripted


def test_the_server_runs_the_app_on_its_own_thread_and_stops() -> None:
    backend, _, _, _ = scripted([("abort", 2, 1), ("done", 2)])
    app = FastAPI()
    loops: list[Any] = []

    @app.get("/tokens")
    async def tokens() -> dict[str, Any]:  # the backend, called from the server's loop
        loops.append(asyncio.get_running_loop())
        out = [d async for d in backend.generate("r1", (1, 2), Sampling(5), "s")]
        return {"ids": [i for d in out for i in d.token_ids], "finish": out[-1].finish_reason}

    server = GatewayServer(app, "127.0.0.1:0").start()
    try:
        got = httpx.get(f"http://{server.address}/tokens", timeout=10).json()
        assert got == {"ids": [2, 3, 4, 5, 6], "finish": "length"}
        with pytest.raises(GatewayBindFailed, match="already in use"):
            GatewayServer(app, server.address)
    finally:
        server.stop()
    assert not server._thread.is_alive() and loops[0] is not None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{server.address}/tokens", timeout=2)


def test_an_api_key_file_is_read_and_a_bad_one_refused(tmp_path: Path) -> None:
    assert read_api_key("") is None
    (tmp_path / "key").write_text("  sk-local \n")
    assert read_api_key(str(tmp_path / "key")) == "sk-local"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_api_key(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="cannot read it"):
        read_api_key(str(tmp_path / "missing"))


def test_a_public_listen_needs_an_api_key_file() -> None:
    with pytest.raises(ConfigError, match="without an API key"):
        config.load(None, ["gateway.listen=0.0.0.0:8000"])
    cfg = config.load(None, ["gateway.listen=0.0.0.0:8000", "gateway.api_key_file=/k"])
    assert cfg.gateway.listen == "0.0.0.0:8000"
    with pytest.raises(ConfigError, match="gateway.listen = 'nowhere'"):
        config.load(None, ["gateway.listen=nowhere"])


def test_pearld_with_its_gateway_port_taken_fails_in_one_line_before_writing(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cfg = config.load(None, ["engine.kind=sim", f"gateway.listen=127.0.0.1:{port}"])
        daemon = Daemon(cfg, tmp_path / "state", f"ipc://{tmp_path}/api.sock")
        with pytest.raises(GatewayBindFailed) as e:
            daemon.start()
    assert "\n" not in str(e.value) and f"127.0.0.1:{port}" in str(e.value)
    assert not (tmp_path / "state" / "log").exists()
