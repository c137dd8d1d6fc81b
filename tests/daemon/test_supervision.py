"""pearld supervises its actors: one that dies is started again, one that keeps dying stops
pearld; its parts stop in the reverse of their start order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pykka
import pytest

from actors import base, names
from pearl import config as config_mod
from pearl.daemon import Daemon
from pearl.log import FileLog
from tests.daemon.conftest import CONFIG, SMALL, wait_until

pytestmark = pytest.mark.slow


class Crash:
    """Tell it to the crashy actor and it fails."""


class Crashy(base.PearlActor):
    name = "crashy"

    def crash(self, msg: Crash) -> None:
        raise RuntimeError("crashed on purpose")

    handles = {Crash: crash}


def test_a_dead_actor_is_restarted_and_one_that_keeps_dying_stops_pearld(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Daemon._factories

    def factories(self: Daemon, recovered: Any) -> dict[str, Any]:
        return {**real(self, recovered), "crashy": lambda: base.start(self.directory, Crashy)}

    monkeypatch.setattr(Daemon, "_factories", factories)
    cfg = config_mod.load(CONFIG, ["daemon.borrow=never", *SMALL])
    daemon = Daemon(cfg, tmp_path / "state", f"ipc://{tmp_path}/api.sock")
    daemon.start()
    try:
        parts = [
            "api", "gateway-socket", "log", "launcher", "metrics", "routes", "actors", "gateway",
            "ticker",
        ]  # fmt: skip
        assert daemon.parts == parts
        for k in range(1, 6):  # five restarts within 5 minutes are allowed
            first = daemon.directory.get("crashy")
            first.tell(Crash())
            wait_until(
                lambda f=first: (
                    (r := daemon.directory.find("crashy")) is not None
                    and r is not f
                    and r.ref.is_alive()
                ),
                10,
                f"restart {k}",
            )
            assert not daemon.failed.is_set()
        assert daemon.directory.get(names.ORCHESTRATOR).ref.is_alive()  # the others were left alone
        daemon.directory.get("crashy").tell(Crash())  # the sixth failure
        wait_until(daemon.failed.is_set, 10, "pearld to give up on the crashy actor")
    finally:
        daemon.stop()
    assert daemon.parts == []
    assert pykka.ActorRegistry.get_all() == []
    FileLog(tmp_path / "state" / "log").close()  # the lock is free


def test_requests_the_router_held_when_it_died_are_sent_again_after_its_restart(
    tmp_path: Path,
) -> None:
    """The Router's pending requests die with it: once pearld has restarted it, every
    RolloutClient sends its requests in flight again, and they complete."""
    from actors.rollout_client import RolloutClient
    from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams

    cfg = config_mod.load(CONFIG, ["daemon.borrow=never", *SMALL])
    daemon = Daemon(cfg, tmp_path / "state", f"ipc://{tmp_path}/api.sock")
    daemon.start()
    client = RolloutClient(daemon.directory, "test-client", wait_s=60.0)
    try:
        first = daemon.directory.get(names.ROUTER)
        first.ref.stop()  # what a Route sent now reaches no one
        fut = client.generate(
            GenerateRequest(rid="r", input_ids=(1, 2, 3), sampling=SamplingParams(max_new_tokens=4))
        )
        wait_until(
            lambda: (r := daemon.directory.find(names.ROUTER)) is not None and r is not first,
            20,
            "the Router restarted",
        )
        out = fut.result(60)
        assert out.finish_reason is FinishReason.LENGTH and len(out.output_ids) == 4
        assert "the Router restarted; sent again" in out.errors
    finally:
        client.close()
        daemon.stop()
