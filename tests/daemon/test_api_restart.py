"""The API endpoint releases its sockets when it fails, so pearld restarts it on the same TCP
port, serving the latest status at once; an endpoint that cannot be restarted stops pearld with
one line, and nothing is restarted after that (issue 41: the API's restart found its port still
bound and pearld exited, on every restart of the same state directory)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from actors import names
from actors.api import ApiEndpoint, ApiSockets, BindFailed
from pearl import config as config_mod
from pearl.daemon import Daemon
from pearl.testing.pearld import free_port
from tests.daemon.conftest import CONFIG, SMALL, wait_until
from transports.protocol import StatusRequest
from transports.rpc import Client

pytestmark = pytest.mark.slow


class Crash:
    """Told to the API endpoint, it fails (as a view it could not render once did)."""


def crash(self: ApiEndpoint, msg: Crash) -> None:
    raise RuntimeError("crashed on purpose")


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    monkeypatch.setitem(ApiEndpoint.handles, Crash, crash)
    cfg = config_mod.load(CONFIG, ["daemon.borrow=never", *SMALL])
    d = Daemon(cfg, tmp_path / "state", f"tcp://127.0.0.1:{free_port()}")
    d.start()
    try:
        yield d
    finally:
        d.stop()
    assert pykka.ActorRegistry.get_all() == []


def api_ref(d: Daemon) -> Any:
    return d.directory.get(names.API)


def restarted(d: Daemon, old: Any) -> bool:
    r = d.directory.find(names.API)
    return r is not None and r is not old and r.ref.is_alive()


def test_a_failed_api_is_restarted_on_its_port_with_the_latest_status(daemon: Daemon) -> None:
    with Client(daemon.endpoint, timeout_s=2.0) as c:
        wait_until(lambda: c.request(StatusRequest()).payload is not None, 10, "a first status")
        seq = c.request(StatusRequest()).payload.seq
        for k in range(3):  # each restart binds the port its predecessor just released
            old = api_ref(daemon)
            old.tell(Crash())
            wait_until(lambda o=old: restarted(daemon, o), 10, f"restart {k + 1}")
            assert not daemon.failed.is_set(), daemon.failure
            status = c.request(StatusRequest()).payload
            assert status is not None and status.seq >= seq  # at once, not at the next change
            assert status.endpoint == daemon.endpoint


def test_an_api_that_cannot_be_restarted_stops_pearld_in_one_line(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    binds: list[str] = []

    def taken(cls: Any, endpoint: str, *args: Any, **kwargs: Any) -> ApiSockets:
        binds.append(endpoint)
        raise BindFailed(f"cannot listen on {endpoint}: the address is already in use", True)

    monkeypatch.setattr(ApiSockets, "bind", classmethod(taken))
    api_ref(daemon).tell(Crash())
    wait_until(daemon.failed.is_set, 10, "pearld to give up on the API")
    assert binds == [daemon.endpoint]
    assert daemon.failure.startswith("actor api could not be restarted: cannot listen on")
    assert "\n" not in daemon.failure
    critical = [r for r in caplog.records if r.levelname == "CRITICAL"]
    assert [r.getMessage() for r in critical] == [daemon.failure]
    for _ in range(3):  # the supervision pass that would come next restarts nothing
        daemon._restart_dead()
    assert binds == [daemon.endpoint] and daemon.directory.find(names.API) is None


def test_a_ticker_that_fails_stops_pearld_in_one_line(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without its ticker pearld would run unsupervised, its deadlines unchecked (issue 41:
    ``daemon.tick_s = inf`` killed the thread silently; the config refuses it now)."""

    def broken(self: Daemon) -> None:
        raise OverflowError("timeout value is too large")

    monkeypatch.setattr(Daemon, "_restart_dead", broken)
    wait_until(daemon.failed.is_set, 10, "pearld to give up when its ticker fails")
    assert daemon.failure == (
        "the ticker failed: OverflowError: timeout value is too large; shutting down"
    )
