"""The fork server and the local launcher's use of it: a host forked from the warm parent runs
in its own session with the environment, log and name it was given and fresh random seeds; it
outlives the server; one that exits is reaped (no zombie); a request that cannot be served is an
error and the next one is served; and a launcher whose server is gone starts subprocesses."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import pytest

from actors.launcher import ForkServer, ForkServerError, LocalProcessLauncher, WorkerSpec, _stat
from pearl.config import load
from tests.actors.test_heart import wait_for

PROBE = textwrap.dedent(
    """
    import json, os, random, signal, sys
    import numpy as np

    def main(argv):
        print("probe says hello", flush=True)
        with open(argv[0] + ".tmp", "w") as f:
            json.dump({
                "pid": os.getpid(), "sid": os.getsid(0), "ppid": os.getppid(),
                "env": {k: os.environ.get(k) for k in ("PROBE_VAR", "SERVER_ONLY")},
                "comm": open("/proc/self/comm").read().strip(),
                "draw": [random.random(), float(np.random.random())],
                "argv": sys.argv,
            }, f)
        os.replace(argv[0] + ".tmp", argv[0])
        if argv[1:] == ["sleep"]:
            signal.pause()  # until the test's signal ends it
        return 3
    """
)


def gone(pid: int) -> bool:
    fields = _stat(pid)
    return fields is None or fields[0] in ("Z", "X", "x")


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    (tmp_path / "probe.py").write_text(PROBE)
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), root]))
    monkeypatch.setenv("SERVER_ONLY", "not for children")
    fs = ForkServer(("probe", "numpy"), tmp_path / "server.log")
    pids: list[int] = []
    yield fs, pids
    fs.close()
    for pid in pids:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_forked_child_has_its_own_session_env_log_name_and_seeds(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fs, pids = server
    out = [tmp_path / f"out{i}.json" for i in range(2)]
    for i in range(2):
        env = {"PROBE_VAR": f"child {i}", "PYTHONPATH": os.environ["PYTHONPATH"]}
        pids.append(fs.spawn("probe", [str(out[i])], env, tmp_path / f"c{i}.log", f"pearl-w{i}.1"))
    wait_for(lambda: all(p.exists() for p in out), timeout=20.0)
    seen = [json.loads(p.read_text()) for p in out]
    for i, s in enumerate(seen):
        assert s["pid"] == pids[i] and s["sid"] == pids[i]  # a session of its own
        assert s["ppid"] == fs.proc.pid  # the server's child, not pearld's
        assert s["env"] == {"PROBE_VAR": f"child {i}", "SERVER_ONLY": None}
        assert s["comm"] == f"pearl-w{i}.1"
        assert s["argv"] == ["probe", str(out[i])]
    assert seen[0]["draw"][0] != seen[1]["draw"][0]  # python's generator
    assert seen[0]["draw"][1] != seen[1]["draw"][1]  # numpy's, imported by the server
    wait_for(lambda: all(gone(p) for p in pids), timeout=20.0)
    for i in range(2):  # exited with main's code 3, reaped by the kernel: no zombie left
        assert "probe says hello" in (tmp_path / f"c{i}.log").read_text()
        assert _stat(pids[i]) is None


def test_a_bad_request_is_an_error_and_the_next_is_served(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fs, pids = server
    with pytest.raises(ForkServerError, match="could not fork: FileNotFoundError"):
        fs.spawn("probe", ["x"], {}, tmp_path / "no such dir" / "c.log")
    out = tmp_path / "ok.json"
    pids.append(fs.spawn("probe", [str(out)], dict(os.environ), None))
    wait_for(out.exists, timeout=20.0)


def test_children_outlive_the_server(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fs, pids = server
    out = tmp_path / "o.json"
    pids.append(fs.spawn("probe", [str(out), "sleep"], dict(os.environ), None))
    wait_for(out.exists, timeout=20.0)
    fs.close()
    assert fs.proc.poll() is not None
    assert not gone(pids[0])  # pearld --keep-workers: hosts stay when the server ends
    with pytest.raises(ForkServerError, match="exited"):
        fs.spawn("probe", [str(out)], {}, None)


def spec(tmp_path: Path, worker: int) -> WorkerSpec:
    cfg = load(None, [])
    return WorkerSpec(
        worker=worker,
        incarnation=1,
        gpus=(worker,),
        endpoint="tcp://127.0.0.1:9",  # nobody: the host waits for pearld until it is stopped
        engine=cfg.engine,
        model=cfg.model.name,
        gpu=cfg.cluster.gpu,
        tp=cfg.cluster.tp,
        heartbeat_s=0.5,
        orphan_s=60.0,
        state_dir=str(tmp_path),
    )


def test_the_launcher_forks_hosts_tracks_and_stops_them_by_pid(tmp_path: Path) -> None:
    launcher = LocalProcessLauncher(tmp_path / "workers", ("actors.worker_host",))
    try:
        a = launcher.launch(spec(tmp_path, 1))
        b = launcher.launch(spec(tmp_path, 2))
        assert launcher.launched() == [a, b] and not launcher.subprocesses()  # forked
        assert launcher.alive(a) and launcher.alive(b)
        assert launcher.cpu_s(a) is not None  # running or sleeping, read from /proc
        launcher.kill(a)
        assert not launcher.alive(a) and _stat(a) is None  # stopped and reaped
        assert launcher.launched() == [b]
        launcher.reap_all(timeout_s=3.0)
        assert not launcher.alive(b) and launcher.launched() == []
    finally:
        launcher.reap_all(timeout_s=1.0)
        launcher.close()


def test_a_launcher_whose_server_died_starts_subprocesses(tmp_path: Path) -> None:
    launcher = LocalProcessLauncher(tmp_path / "workers", ("actors.worker_host",))
    try:
        server = launcher.fork_server
        assert server is not None
        server.proc.kill()
        pid = launcher.launch(spec(tmp_path, 1))
        assert launcher.fork_server is None and list(launcher.subprocesses()) == [pid]
        assert launcher.alive(pid)
        assert "actors.worker_host" in launcher.subprocesses()[pid]
    finally:
        launcher.reap_all(timeout_s=1.0)
        launcher.close()
