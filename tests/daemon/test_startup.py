"""pearld fails fast and cleanly before serving: non-zero within seconds, one line naming the
problem and the fix, the state directory's lock released, no worker host or actor left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from pearl import config as config_mod
from pearl.core.errors import PearlError
from pearl.daemon import Daemon
from pearl.log import FileLog
from tests.daemon.conftest import CONFIG, ROOT, SMALL, Pearld, wait_until

pytestmark = pytest.mark.slow

EXIT_S = 5.0  # issue 21: a failed start exits within this


def run_failing(cmd: list[str]) -> tuple[int, float, str]:
    """Run a pearld that should fail; (exit status, seconds to exit, stderr). Killed by pid."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode, time.monotonic() - t0, err


def the_problem(stderr: str) -> str:
    """The one line pearld prints about a failed start; structured log lines may precede it."""
    assert "Traceback" not in stderr and "exc=" not in stderr, stderr
    assert "level=error" not in stderr and "level=critical" not in stderr, stderr
    lines = [x for x in stderr.splitlines() if x.strip() and not x.startswith("ts=")]
    assert len(lines) == 1 and lines[0].startswith("pearld: "), stderr
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_taken_port_exits_fast_and_frees_the_lock(pearld_factory: Any, taken_port: int) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never", start=False)
    rc, took, err = run_failing(d.command(f"tcp://127.0.0.1:{taken_port}"))
    assert rc != 0 and took <= EXIT_S, (rc, took, err)
    line = the_problem(err)
    assert f"tcp://127.0.0.1:{taken_port}" in line and "already in use" in line, line
    assert "--endpoint" in line, line  # the fix
    assert not (d.state / "log").exists()  # bound before anything was written
    d.sets = [*d.sets, "cluster.tp=4"]  # so the state directory is bound to no config yet
    d.start()  # the lock is free: a pearld on the same state directory comes up
    assert d.settled()["seq"] > 0 and d.status()["tp"] == 4


def test_a_log_of_another_cluster_is_refused_in_config_keys(tmp_path: Path) -> None:
    from pearl.daemon import open_log

    state = tmp_path / "state"
    open_log(config_mod.load(CONFIG, SMALL), state).close()
    other = config_mod.load(CONFIG, [*SMALL, "cluster.tp=4", "cluster.reserved_gpus=4-7,16-19"])
    with pytest.raises(PearlError) as e:
        open_log(other, state)
    assert str(e.value) == (
        f"{state} holds the log of another cluster: it was created with cluster.tp=2, "
        "cluster.reserved_gpus=4-7; this config has cluster.tp=4, cluster.reserved_gpus=4-7,16-19. "
        "Use another --state-dir, or the config the log was created with"
    )
    FileLog(state / "log").close()  # refused, and the lock is free


@pytest.mark.parametrize(
    "endpoint, words",
    [
        ("tcp://nonsense", "tcp://HOST:PORT"),
        ("tcp://127.0.0.1:notaport", "tcp://HOST:PORT"),
        ("tcp://127.0.0.1:70000", "port 1-65535"),
        ("ipc:///nonexistent-pearl-dir/api.sock", "no directory /nonexistent-pearl-dir"),
    ],
)
def test_a_bad_endpoint_exits_fast_with_one_line(
    pearld_factory: Any, endpoint: str, words: str
) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never", start=False)
    rc, took, err = run_failing(d.command(endpoint))
    assert rc != 0 and took <= EXIT_S, (rc, took, err)
    line = the_problem(err)
    assert endpoint in line and words in line and "--endpoint" in line, line
    d.start()
    assert d.status()["seq"] > 0


def test_a_held_lock_names_its_holder_and_is_free_once_it_stops(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    assert d.proc is not None
    rc, took, err = run_failing(d.command(f"ipc://{d.tmp}/other.sock"))
    assert rc != 0 and took <= EXIT_S, (rc, took, err)
    line = the_problem(err)
    assert f"another pearld (pid {d.proc.pid})" in line and "--state-dir" in line, line
    assert d.status()["seq"] > 0  # the first one is untouched
    assert d.stop() == 0
    d.start()
    assert d.status()["seq"] > 0


def test_a_config_error_is_one_line(tmp_path: Path) -> None:
    d = Pearld(tmp_path, ["engine.nonsense=1"])
    rc, took, err = run_failing(d.command(f"ipc://{tmp_path}/api.sock"))
    assert rc != 0 and took <= EXIT_S, (rc, took, err)
    assert "engine.nonsense" in the_problem(err)
    assert not d.state.exists()  # refused before touching the state directory


def test_a_failure_after_hosts_started_stops_them_and_every_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last actor fails once worker hosts are up: all of it is taken down in reverse."""
    launched: list[int] = []
    real = Daemon._factories

    def factories(self: Daemon, recovered: Any) -> dict[str, Any]:
        specs = real(self, recovered)

        def boom() -> Any:
            wait_until(lambda: self.launcher.launched(), 30, "worker hosts to be launched")
            launched.extend(self.launcher.launched())
            raise PearlError("boom: the last actor cannot start")

        return {**specs, "boom": boom}

    monkeypatch.setattr(Daemon, "_factories", factories)
    cfg = config_mod.load(CONFIG, ["daemon.borrow=never", *SMALL])
    daemon = Daemon(cfg, tmp_path / "state", f"ipc://{tmp_path}/api.sock")
    try:
        with pytest.raises(PearlError, match="boom"):
            daemon.start()
        assert launched
        for pid in launched:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)  # reaped (waited for) by the launcher, not just signalled
        assert pykka.ActorRegistry.get_all() == []
        FileLog(tmp_path / "state" / "log").close()  # the lock is free
    finally:
        for pid in launched:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_corrupted_log_is_one_line_and_leaves_the_lock_free(tmp_path: Path) -> None:
    from pearl.core import events as ev
    from pearl.daemon import init_records
    from pearl.log.segments import DirLock

    d = Pearld(tmp_path, ["daemon.borrow=never", *SMALL])
    cfg = config_mod.load(CONFIG, d.sets)
    with FileLog(d.state / "log", create=True) as log:
        log.append(init_records(cfg))
        for _ in range(3):
            log.append([ev.GpusAdded(gpus=(8, 9))])
            log.append([ev.GpusReclaimed(gpus=(8, 9))])
    seg = min((d.state / "log").glob("*.seg"))
    raw = bytearray(seg.read_bytes())
    raw[20] ^= 0xFF  # inside the first record: valid frames follow, so not a torn tail
    seg.write_bytes(bytes(raw))
    rc, took, err = run_failing(d.command(f"ipc://{tmp_path}/api.sock"))
    assert rc != 0 and took <= EXIT_S, (rc, took, err)
    line = the_problem(err)
    assert seg.name in line and "backup" in line, line  # where, and what to do
    DirLock(d.state / "log").release()  # nobody holds it


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("gateway.api_key_file=/dev/zero", "'/dev/zero': not a regular file"),
        ("daemon.tick_s=nan", "daemon.tick_s: expected a finite number, got nan"),
        ("daemon.tick_s=inf", "daemon.tick_s: expected a finite number, got inf"),
        ("daemon.snapshot_every=-5", "daemon.snapshot_every must be >= 1, got -5"),
    ],
)
def test_a_value_out_of_range_is_one_line_before_anything_starts(
    tmp_path: Path, override: str, words: str
) -> None:
    """Issue 41: /dev/zero as the API key blocked the start forever; nan and inf were taken."""
    d = Pearld(tmp_path, ["gateway.listen=127.0.0.1:0", override])
    rc, took, err = run_failing(d.command(f"ipc://{tmp_path}/api.sock"))
    assert rc == 1 and took <= EXIT_S, (rc, took, err)
    assert words in the_problem(err)
    assert not (d.state / "log").exists()  # refused before anything was written


VLLM_CONFIG = ROOT / "configs" / "local-vllm.toml"


@pytest.mark.parametrize(
    "case, words",
    [
        ("no-model", "engine.kind = 'vllm' needs engine.vllm.model_path"),
        ("not-a-model", "is not a model directory (no config.json there)"),
        ("no-interpreter", "engine.vllm.python = '/nonexistent/bin/python' cannot be run"),
        ("no-vllm", "cannot import vllm"),
    ],
)
def test_an_engine_that_cannot_start_anywhere_is_one_line_and_binds_nothing(
    tmp_path: Path, case: str, words: str
) -> None:
    """Issue 41: such a config exited 0 and relaunched worker hosts every 30 s forever."""
    import sys

    model = tmp_path / "model"
    model.mkdir()
    if case != "not-a-model":
        (model / "config.json").write_text("{}")
    sets = {
        "no-model": ["engine.vllm.model_path="],
        "not-a-model": [f"engine.vllm.model_path={model}"],
        "no-interpreter": [
            f"engine.vllm.model_path={model}",
            "engine.vllm.python=/nonexistent/bin/python",
        ],
        "no-vllm": [f"engine.vllm.model_path={model}", f"engine.vllm.python={sys.executable}"],
    }[case]
    d = Pearld(tmp_path, ["gateway.listen=127.0.0.1:0", *sets], config=VLLM_CONFIG)
    sock = tmp_path / "api.sock"
    rc, took, err = run_failing(d.command(f"ipc://{sock}"))
    assert rc == 1 and took <= EXIT_S, (rc, took, err)
    assert words in the_problem(err)
    assert not sock.exists() and not (d.state / "log").exists()  # nothing bound or written


def test_a_worker_that_cannot_start_is_in_status_and_a_request_gets_503_in_time(
    tmp_path: Path,
) -> None:
    """Issue 41: with a preset no worker can load, the worker stayed transitioning with its
    reason only in workers/*.log, and a gateway request hung for 300 s and more."""
    import json
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = Pearld(
        tmp_path,
        [
            "engine.torch.preset=nonexistent",
            "rl.env=",
            f"gateway.listen=127.0.0.1:{port}",
            "gateway.request_timeout_s=3",
            "daemon.restart_backoff_s=0.2",
        ],
        config=ROOT / "configs" / "local-cpu.toml",
    )
    try:
        d.start()

        def said_why() -> bool:
            faults = d.status().get("worker_faults") or {}
            return any("unknown model preset 'nonexistent'" in why for why in faults.values())

        wait_until(said_why, 60, "pearl status to say why the worker cannot start")
        body = {"model": "nonexistent", "prompt": [5, 6], "max_tokens": 4}
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        t0 = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        took = time.monotonic() - t0
        assert e.value.code == 503 and float(e.value.headers["Retry-After"]) > 0
        assert 2.5 < took < 3.0 + 2.0, took  # its request_timeout_s, and a tick or so
        assert "within 3 s" in json.loads(e.value.read())["error"]["message"]
    finally:
        d.cleanup()
