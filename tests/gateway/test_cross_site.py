"""No cross-site control of a loopback gateway without a key: control routes take JSON only, a
Host that does not name the listener is refused (DNS rebinding), and a browser's Origin is
refused unless configured (then it gets CORS answers)."""

from __future__ import annotations

import httpx
import pytest

from pearl.gateway.guard import host_allowed
from tests.gateway.scripted import ScriptedBackend
from tests.gateway.test_bounds import connect, gateway, until_closed

EVENT = "/pearl/v1/events/gpus-added"


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "multipart/form-data; boundary=x"},
        {},
    ],
)
def test_a_control_post_that_is_not_json_gets_415(headers: dict[str, str]) -> None:
    backend = ScriptedBackend()
    with gateway(backend) as server, httpx.Client(base_url=f"http://{server.address}") as http:
        r = http.post(EVENT, content=b'{"gpus": [4, 5]}', headers=headers)
        assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
        for media in ("application/json", "Application/JSON; charset=utf-8"):
            r = http.post(EVENT, content=b'{"gpus": [4, 5]}', headers={"Content-Type": media})
            assert r.status_code == 200
    assert backend.events == [("gpus-added", {"gpus": [4, 5]})] * 2


def test_a_host_that_does_not_name_the_loopback_listener_gets_421() -> None:
    with gateway(ScriptedBackend()) as server, httpx.Client() as http:
        port = int(server.address.rsplit(":", 1)[1])
        url = f"http://{server.address}/pearl/v1/status"
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", "[::2]"):
            r = http.get(url, headers={"Host": host})
            assert r.status_code == 421, host
            assert "loopback" in r.json()["error"]["message"]
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"LOCALHOST:{port}"):
            assert http.get(url, headers={"Host": host}).status_code == 200, host
        with connect(server) as old:  # HTTP/1.0 without Host: not a browser
            old.sendall(b"GET /pearl/v1/status HTTP/1.0\r\n\r\n")
            assert until_closed(old).startswith(b"HTTP/1.1 200 ")


def test_the_host_rule_applies_to_loopback_listeners_only() -> None:
    assert host_allowed(b"[::1]:8000", ("::1", 8000))
    assert host_allowed(b"localhost:8000", ("::1", 8000))
    assert not host_allowed(b"[::1]:8001", ("::1", 8000))
    assert host_allowed(b"127.0.0.5:80", ("127.0.0.5", 80)) and host_allowed(
        b"localhost", ("127.0.0.1", 80)
    )
    assert not host_allowed(b"attacker.example:8000", ("127.0.0.1", 8000))
    assert not host_allowed(b"localhost:80x", ("127.0.0.1", 80))
    assert not host_allowed(b"attacker.example", ("::ffff:127.0.0.1", 80))
    # Beyond loopback the API key guards the gateway, and a proxy may name it as it likes.
    assert host_allowed(b"gateway.example.com", ("10.0.0.7", 8000))
    assert host_allowed(b"anything", ("testserver", 80))


def test_a_browser_origin_is_refused_unless_allowed_and_then_gets_cors() -> None:
    backend = ScriptedBackend()
    allowed = "http://localhost:3000"
    with (
        gateway(backend, allowed_origins=[allowed + "/"]) as server,
        httpx.Client(base_url=f"http://{server.address}") as http,
    ):
        for origin in ("http://evil.example", "null", "http://localhost:3001"):
            r = http.post(EVENT, json={"gpus": [1]}, headers={"Origin": origin})
            assert r.status_code == 403 and "gateway.allowed_origins" in r.text
            assert http.get("/pearl/v1/status", headers={"Origin": origin}).status_code == 403
        assert backend.events == []
        r = http.post(EVENT, json={"gpus": [1]}, headers={"Origin": allowed})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == allowed
        pre = http.options(
            EVENT,
            headers={
                "Origin": allowed,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type, authorization",
            },
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == allowed
    assert backend.events == [("gpus-added", {"gpus": [1]})]
    with gateway(ScriptedBackend()) as server:  # none allowed: every Origin is refused
        r = httpx.get(f"http://{server.address}/v1/models", headers={"Origin": allowed})
        assert r.status_code == 403
