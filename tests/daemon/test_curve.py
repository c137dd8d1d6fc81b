"""CURVE end to end: keys from `pearl keys generate DIR` (no other flags) serve a whole pearld.

pearld on a loopback TCP endpoint with ``daemon.keys_dir``: its sim worker hosts get their keys
from the launcher and serve; `pearl status` and `pearl watch` (a change after an event, not just
the snapshot) work with the client keys; without keys, or with another deployment's, the CLI is
refused within a bounded time and told that authentication failed and to check --keys-dir.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pearl
from pearl.core import events as ev
from pearl.core.errors import PearlError
from tests.daemon.conftest import ROOT, SMALL, Pearld
from transports.auth import ClientKeys

pytestmark = pytest.mark.slow


def pearl_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PEARL_KEYS", "PEARL_ENDPOINT")}
    return subprocess.run(
        [sys.executable, "-m", "pearl", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def routable(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in status["workers"] if w["activity"] == "active" and w["role"] != "training"]


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[tuple[Pearld, Path]]:
    keys = tmp_path / "keys"
    made = pearl_cli("keys", "generate", str(keys))  # no other flags: the contract
    assert made.returncode == 0, made.stderr
    d = Pearld(tmp_path / "d", [*SMALL, "daemon.borrow=never", f"daemon.keys_dir={keys}"])
    d.tmp.mkdir()
    d.endpoint = f"tcp://127.0.0.1:{free_port()}"
    d.client_keys = ClientKeys.load(keys)
    try:
        d.start()
        yield d, keys
    finally:
        d.cleanup()  # pearld and every worker host, by pid


def test_pearld_with_keys_serves_and_only_keyed_clients_get_in(keyed: Any, tmp_path: Path) -> None:
    d, keys = keyed
    s = d.settled(60)
    assert len(routable(s)) == 2, s["workers"]  # the hosts dialled pearld with their keys
    logs = "".join(p.read_text(errors="replace") for p in (d.state / "workers").glob("*.log"))
    assert "cannot read CURVE key" not in logs and "cannot start" not in logs

    r = pearl_cli("status", "--endpoint", d.endpoint, "--keys-dir", str(keys))
    assert r.returncode == 0 and "mode" in r.stdout, r.stderr

    # watch: the snapshot, then the change an event makes (changes come over CURVE PUB/SUB).
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pearl",
            "watch",
            "--json",
            "--count",
            "2",
            "--endpoint",
            d.endpoint,
            "--keys-dir",
            str(keys),
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert watch.stdout is not None
        first = watch.stdout.readline()  # the snapshot
        assert '"seq"' in first, watch.stderr.read() if watch.stderr else ""
        seq = d.event(ev.GpusAdded(gpus=(8, 9, 10, 11)))
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 0, err
        assert "nothing heard" not in err
        change = json.loads(out.splitlines()[0])
        assert change["seq"] >= seq  # a logged change after the event, not the snapshot again
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(5)
    s = d.settled(60)
    assert len(routable(s)) == 4  # new hosts on the added GPUs got their keys too

    # Refused: no keys, another deployment's keys; bounded time, and what to check.
    other = tmp_path / "other"
    assert pearl_cli("keys", "generate", str(other)).returncode == 0
    for extra, expect in (
        ([], "pass --keys-dir DIR"),
        (["--keys-dir", str(other)], f"check --keys-dir {other}"),
    ):
        t0 = time.monotonic()
        r = pearl_cli("status", "--endpoint", d.endpoint, "--timeout", "1", *extra)
        assert r.returncode == 1 and time.monotonic() - t0 < 15, r
        assert "authentication failed" in r.stderr and expect in r.stderr, r.stderr
        r = pearl_cli("watch", "--endpoint", d.endpoint, "--timeout", "1", *extra)
        assert r.returncode == 1 and "authentication failed" in r.stderr, r.stderr
    r = pearl_cli("status", "--endpoint", d.endpoint, "--keys-dir", str(tmp_path / "none"))
    assert r.returncode == 1 and "check --keys-dir" in r.stderr, r.stderr

    # The Python client: the same keys work, none are refused with the same explanation.
    rt = pearl.connect(d.endpoint, keys_dir=str(keys), timeout_s=2.0)
    try:
        assert rt.status().seq >= seq
    finally:
        rt.stop()
    with pytest.raises(PearlError, match="authentication failed.*keys_dir=DIR"):
        pearl.connect(d.endpoint, timeout_s=0.3)


def test_pearld_refuses_a_key_dir_without_worker_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert pearl_cli("keys", "generate", str(keys)).returncode == 0
    (keys / "worker.key_secret").unlink()
    d = Pearld(tmp_path / "d", [*SMALL, f"daemon.keys_dir={keys}"])
    d.tmp.mkdir()
    try:
        r = subprocess.run(
            d.command(f"tcp://127.0.0.1:{free_port()}"),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert r.returncode == 1
        assert "worker" in r.stderr and f"pearl keys generate {keys}" in r.stderr, r.stderr
        assert not list((d.state / "workers").glob("*.pid"))  # no host was started
    finally:
        d.cleanup()
