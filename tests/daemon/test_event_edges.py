"""Elastic events over the gateway's HTTP route, at its edges (issue 41 item 12): a GPU event
naming no GPU is a 400 naming ``gpus``; a refusal by a full disk is a 503 with ``Retry-After``
(transient: the same event is taken once the disk takes writes), not a 409 a client gives up on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from pearl.log import failpoints
from pearl.testing.pearld import free_port
from tests.daemon.conftest import Pearld, wait_until

pytestmark = pytest.mark.slow


def post(port: int, kind: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/pearl/v1/events/{kind}", json=body, timeout=30)


def test_event_edges_over_http(
    pearld_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "disk-full"
    monkeypatch.setenv(failpoints.DISK_ENV, str(flag))
    port = free_port()
    d: Pearld = pearld_factory("daemon.borrow=never", f"gateway.listen=127.0.0.1:{port}")
    before = d.settled()["seq"]

    for kind in ("gpus-added", "gpus-reclaimed", "gpus-reclaim-cancelled"):
        r = post(port, kind, {"gpus": []})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "gpus" and err["message"].startswith(f"{kind}: no GPU id given"), err
    r = post(port, "gpus-added", {"gpus": [8, "9"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "gpus", r.text

    flag.write_text("full")
    r = post(port, "gpus-added", {"gpus": [8, 9]})
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) >= 1
    assert "No space left on device" in r.json()["error"]["message"]
    assert d.status()["seq"] == before  # nothing was logged
    flag.unlink()
    r = wait_until(
        lambda: (r := post(port, "gpus-added", {"gpus": [8, 9]})).status_code == 200 and r,
        20,
        "the event to be taken once the disk heals",
    )
    assert r.json()["seq"] > before
    assert d.running()
