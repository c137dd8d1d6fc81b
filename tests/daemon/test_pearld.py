"""pearld end to end: events over ZeroMQ, status vs replay, bad input, supervision, fuzzing."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from pearl.core import events as ev
from pearl.core.state import validate
from tests.daemon.conftest import CONFIG, ROOT, Pearld, wait_until
from transports.protocol import PROTOCOL_VERSION
from transports.rpc import RemoteError

pytestmark = pytest.mark.slow


def routable(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in status["workers"] if w["activity"] == "active" and w["role"] != "training"]


def cli(*args: str, endpoint: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pearl", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PEARL_ENDPOINT": endpoint},
        cwd=ROOT,
        timeout=60,
    )


def test_cli_events_status_and_replay_agree(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    s = d.settled()
    assert len(routable(s)) == 2  # the reserved GPUs 4-7 as two TP2 workers
    r = cli("event", "gpus-added", "--gpus", "8-11", endpoint=d.endpoint)
    assert r.returncode == 0 and "logged at seq" in r.stdout, r.stderr
    seq = int(r.stdout.rsplit(" ", 1)[1])
    s = d.settled()
    assert len(routable(s)) == 4
    logged = dict(d.records())
    assert logged[seq] == ev.GpusAdded(gpus=(8, 9, 10, 11))  # acknowledged only once durable

    r = cli("event", "gpus-reclaimed", "--gpus", "9", endpoint=d.endpoint)
    assert r.returncode == 0, r.stderr
    s = d.settled()
    assert len(routable(s)) == 3 and all(9 not in w["gpus"] for w in s["workers"])

    status = json.loads(cli("status", "--json", endpoint=d.endpoint).stdout)
    rep = json.loads(
        cli(
            "log",
            "replay",
            str(d.state),
            "--json",
            "--until",
            str(status["seq"]),
            endpoint=d.endpoint,
        ).stdout
    )
    assert (status["seq"], status["workers"]) == (rep["seq"], rep["workers"])
    human = cli("status", endpoint=d.endpoint).stdout
    assert "mode" in human and "dedicated" in human


@pytest.mark.parametrize(
    "args, words",
    [
        (("event", "gpus-added", "--gpus", "40"), "not a preemptible GPU"),
        (("event", "gpus-reclaimed", "--gpus", "12"), "not present"),
        (("event", "gpus-reclaimed", "--gpus", "5"), "reserved"),
        (("event", "training-finished", "--step", "1"), "without a training-begin"),
        (("event", "gpus-added", "--gpus", "x"), "not a GPU id"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    pearld_factory: Any, args: Any, words: str
) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    before = d.settled()["seq"]
    r = cli(*args, endpoint=d.endpoint)
    assert r.returncode != 0
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert d.status()["seq"] == before


def test_training_begin_twice_is_refused(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    d.settled()
    d.event(ev.TrainingBegin(step=1))
    with pytest.raises(RemoteError, match="training-begin while training step 1"):
        d.event(ev.TrainingBegin(step=2))


def test_status_right_after_an_ack_shows_the_event(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    d.settled()
    for step in range(1, 21):  # the view is updated asynchronously: a lost race shows within 20
        seq = d.event(ev.TrainingBegin(step=step))
        s = d.status()
        assert s["seq"] >= seq and s["phase"] == "training", (step, seq, s["seq"])
        seq = d.event(ev.TrainingFinished(step=step, weights_version=None))
        s = d.status()
        assert s["seq"] >= seq and s["phase"] == "idle", (step, seq, s["seq"])


def test_config_typo_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.read_text().replace("[cluster]\n", "[cluster]\ntpp = 2\n"))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pearl.daemon",
            "--config",
            str(bad),
            "--state-dir",
            str(tmp_path / "s"),
            "--endpoint",
            f"ipc://{tmp_path}/x.sock",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 1 and "unknown key cluster.tpp; did you mean 'tp'?" in r.stderr
    assert "Traceback" not in r.stderr


def test_second_daemon_on_same_state_is_refused(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    r = subprocess.run(
        d.command(f"ipc://{d.tmp}/other.sock"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 1 and "lock" in r.stderr.lower(), r.stderr


def test_borrow_cycle_returns_gpus_before_training(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=always")
    s = d.settled()
    assert len(routable(s)) == 4 and s["budget"]["lent"]
    d.event(ev.TrainingBegin(step=1))
    s = wait_until(lambda: (x := d.status())["training_may_proceed"] == 1 and x, 20, "proceed")
    trainer = next(w for w in s["workers"] if w["role"] == "training")
    assert trainer["activity"] == "active"
    assert all(
        w["activity"] == "inactive"
        for w in s["workers"]
        if w["zone"] == "overlap" and w["role"] != "training"
    )
    d.event(ev.TrainingFinished(step=1, weights_version=1))
    s = d.settled()
    assert len(routable(s)) == 4 and s["weights_version"] == 1


def test_killed_worker_host_is_detected_and_restarted(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    s = d.settled()
    victim = routable(s)[0]
    name = f"worker-{victim['id']}-{victim['incarnation']}"
    old = d.host_pids()[name]
    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)
    wait_until(
        pred=lambda: victim["id"] in d.status()["failed"],
        timeout=5,
        what="failure to be logged",
        every=0.01,
    )
    detected = time.monotonic() - t0
    assert detected <= 3 * 0.2 + 0.5, detected  # 3 heartbeat intervals + one supervision pass
    wait_until(lambda: d.host_pids().get(name, old) != old, 20, "a new host process")
    s = d.settled()
    assert victim["id"] in {w["id"] for w in routable(s)}
    failures = [r for _, r in d.records() if isinstance(r, ev.WorkerFailed)]
    assert failures and failures[-1].worker == victim["id"]


def test_concurrent_clients_serialise_into_a_valid_sequence(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    d.settled()
    acks: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def client_loop(pair: tuple[int, int]) -> None:
        from transports.protocol import Event
        from transports.rpc import Client

        with Client(d.endpoint, timeout_s=5.0) as c:
            for _ in range(3):
                for rec in (ev.GpusAdded(gpus=pair), ev.GpusReclaimed(gpus=pair)):
                    # Facts, each taken at once: a GPU re-added while its worker still leaves
                    # it waits in the table, not in the client.
                    seq = c.request(Event.of(rec)).seq
                    with lock:
                        acks.append((seq, rec))

    threads = [threading.Thread(target=client_loop, args=((g, g + 1),)) for g in (8, 10, 12, 14)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(acks) == 24 and len({s for s, _ in acks}) == 24
    d.settled()
    logged = dict(d.records())
    for seq, rec in acks:
        assert logged[seq] == rec
    validate(d.replayed())


def test_gpus_reclaimed_and_granted_again_at_once_end_up_serving(pearld_factory: Any) -> None:
    """A node that restarts faster than its workers stop: the re-grant is taken at once, the
    GPUs wait for their old workers to go, and new workers serve on them."""
    d: Pearld = pearld_factory("daemon.borrow=never")
    d.settled()
    d.event(ev.GpusAdded(gpus=(8, 9, 10, 11)))
    s = d.settled()
    old = {w["gpus"][0]: w["incarnation"] for w in routable(s) if w["gpus"][0] >= 8}
    assert sorted(old) == [8, 10]  # TP 2
    d.event(ev.GpusReclaimed(gpus=(8, 9)))
    d.event(ev.GpusAdded(gpus=(8, 9)))  # no refusal, whatever the old workers are doing
    s = d.settled()
    serving = {w["gpus"][0]: w["incarnation"] for w in routable(s)}
    assert {8, 10} <= set(serving) and serving[8] != old[8] and serving[10] == old[10]
    assert {8, 9, 10, 11} <= set(s["gpus"]["present"])
    assert not s["gpus"]["reclaiming"] and not s["gpus"]["regranted"]
    validate(d.replayed())


def test_fuzzed_frames_never_take_pearld_down(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    d.settled()
    rng = random.Random(7)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(d.endpoint)
    good = {
        "proto": PROTOCOL_VERSION,
        "id": 1,
        "corr": 0,
        "sender": "fuzz",
        "kind": "event",
        "body": {"record": {"kind": "gpus-added", "v": 1, "gpus": [8, 9]}},
    }
    try:
        for i in range(3000):
            pick = rng.random()
            if pick < 0.3:
                frames = [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(1, 3))]
            elif pick < 0.6:
                obj = {
                    rng.choice(["proto", "id", "kind", "body", "x"]): rng.choice(
                        [1, "event", None, [1, 2], {"a": 1}, -5, 2**40]
                    )
                    for _ in range(rng.randint(0, 6))
                }
                frames = [msgpack.packb(obj)]
            elif pick < 0.8:
                bad = dict(good, id=i + 2)
                key = rng.choice(list(bad))
                bad[key] = rng.choice([None, "zzz", 99, {"kind": "nope"}, [0]])
                frames = [msgpack.packb(bad)]
            else:
                raw = msgpack.packb(dict(good, id=i + 2))
                frames = [raw[: rng.randint(0, len(raw) - 1)]]
            sock.send_multipart(frames)
            while sock.poll(0):
                sock.recv_multipart()
    finally:
        sock.close()
    assert d.proc is not None and d.proc.poll() is None
    assert d.status()["seq"] > 0  # still serving


def test_status_round_trip_is_fast(pearld_factory: Any) -> None:
    d: Pearld = pearld_factory("daemon.borrow=never")
    d.settled()
    t0 = time.perf_counter()
    for _ in range(200):
        d.status()
    assert (time.perf_counter() - t0) / 200 < 0.02


def test_beyond_loopback_needs_curve_and_works_with_it(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://0.0.0.0:{port}"
    base = [
        sys.executable,
        "-m",
        "pearl.daemon",
        "--config",
        str(CONFIG),
        "--endpoint",
        endpoint,
        "--set",
        "daemon.borrow=never",
        "--set",
        "engine.sim.time_scale=0.001",
        "--set",
        "cluster.training_gpus=0-3",
        "--set",
        "cluster.reserved_gpus=4-7",
        "--set",
        "cluster.preemptible_gpus=8-15",
    ]
    refused = subprocess.run(
        [*base, "--state-dir", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert refused.returncode == 1 and "pearl keys generate" in refused.stderr
    keys = tmp_path / "keys"
    assert (
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pearl",
                "keys",
                "generate",
                str(keys),
                "--client",
                "worker",
                "--client",
                "client",
            ],
            cwd=ROOT,
            capture_output=True,
            timeout=60,
        ).returncode
        == 0
    )
    d = Pearld(tmp_path, [])
    d.state = tmp_path / "b"
    d.proc = subprocess.Popen(
        [*base, "--state-dir", str(d.state), "--set", f"daemon.keys_dir={keys}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        local = f"tcp://127.0.0.1:{port}"

        def status() -> dict[str, Any] | None:
            r = cli("status", "--json", "--keys-dir", str(keys), "--timeout", "1", endpoint=local)
            return json.loads(r.stdout) if r.returncode == 0 else None

        s = wait_until(
            lambda: (x := status()) and len(routable(x)) == 2 and x,
            60,
            "workers to connect over CURVE",
        )
        assert s["seq"] > 0
        plain = cli("status", "--timeout", "0.5", endpoint=local)  # no keys: no answer
        assert plain.returncode != 0
    finally:
        d.cleanup()
