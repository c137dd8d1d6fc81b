"""ServerProcess's log: bounded (copied to LOG.1 and cut back past its limit, the server writing
on at the new end), kept where ``$PEARL_SERVER_LOGS`` says, removed when the server stops, and
the logs of worker hosts that are gone removed when the next server starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pearl.engines.process import LOG_DIR_ENV, ServerProcess
from pearl.testing.wait import wait_until

CHATTY = (
    "import sys, time\n"
    "for i in range(10**6):\n"
    "    sys.stdout.write('line %d ' % i + 'x' * 200 + '\\n'); sys.stdout.flush()\n"
    "    time.sleep(0.0005)\n"
)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_servers_own_log_is_bounded_kept_in_its_folder_and_removed_at_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOG_DIR_ENV, str(tmp_path))
    stale = tmp_path / f"pearl-test-{dead_pid()}-abc.log"
    stale.write_text("a gone host's server")
    server = ServerProcess([sys.executable, "-c", CHATTY], prefix="test", max_log_bytes=20_000)
    try:
        assert server.log_path.parent == tmp_path and not stale.exists()
        assert server.log_path.name.startswith(f"pearl-test-{os.getpid()}-")
        wait_until(lambda: server.log_path.stat().st_size > 20_000, 30, "the log to grow")
        assert server.bound_log()
        backup = server.log_path.with_name(server.log_path.name + ".1")
        assert backup.stat().st_size > 20_000
        wait_until(lambda: server.log_path.stat().st_size > 1000, 30, "more output")
        head = server.log_path.read_bytes()[:5]
        assert head.startswith(b"line ")  # appended at the new end: no hole of zeros
    finally:
        server.stop(grace_s=5)
    assert not server.log_path.exists() and not backup.exists()


def test_a_named_log_is_the_callers_and_stays(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    server = ServerProcess([sys.executable, "-c", "print('hello')"], str(path))
    wait_until(lambda: not server.alive(), 30, "the server to end")
    server.stop()
    assert path.read_text().strip() == "hello"
