"""The workers/ folder stays bounded: the last few logs per slot, no pid file of a dead host, and
a log that rotates instead of growing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from actors import worker_files as wf
from actors.launcher import LocalProcessLauncher

ROOT = Path(__file__).resolve().parents[2]


def touch(folder: Path, name: str, text: str = "") -> Path:
    p = folder / name
    p.write_text(text)
    return p


def exited_pid() -> int:
    """The pid of a child that has exited and been waited for."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_prune_keeps_the_newest_logs_per_slot_and_those_of_running_hosts(tmp_path: Path) -> None:
    for inc in range(1, 11):
        touch(tmp_path, f"worker-0-{inc}.log")
        touch(tmp_path, f"worker-0-{inc}.pid")
    touch(tmp_path, "worker-0-2.log.1")
    touch(tmp_path, "worker-0-9.log.1")
    touch(tmp_path, "worker-1-4.log")
    touch(tmp_path, "forkserver.log")  # not a worker's: never touched
    running = {tmp_path / "worker-0-2.pid", tmp_path / "worker-0-10.pid"}
    removed = wf.prune(tmp_path, 0, keep=3, alive=lambda p: p in running)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(
        [
            "forkserver.log",
            "worker-0-10.log",
            "worker-0-10.pid",
            "worker-0-2.log",  # its host still runs: an unlinked open log keeps its space
            "worker-0-2.log.1",
            "worker-0-2.pid",
            "worker-0-8.log",
            "worker-0-9.log",
            "worker-0-9.log.1",
            "worker-1-4.log",  # another slot: not asked
        ]
    )
    assert removed == 24 - len(left)
    assert wf.prune(tmp_path, alive=lambda p: p in running) == 0  # all slots: nothing else


def test_a_pid_file_is_stale_once_its_process_is_gone_or_its_pid_reused(tmp_path: Path) -> None:
    mine = touch(tmp_path, "worker-0-1.pid", f"{os.getpid()}\n")
    assert wf.host_alive(mine)
    assert not wf.host_alive(touch(tmp_path, "worker-0-2.pid", f"{exited_pid()}\n"))
    assert not wf.host_alive(touch(tmp_path, "worker-0-3.pid", "not a pid"))
    reused = touch(tmp_path, "worker-0-4.pid", f"{os.getpid()}\n")
    os.utime(reused, (1.0, 1.0))  # written long before this process started: another host's
    assert not wf.host_alive(reused)
    assert wf.prune(tmp_path) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-0-1.pid"]


def test_the_launcher_prunes_what_an_earlier_run_left(tmp_path: Path) -> None:
    for inc in range(1, 6):
        touch(tmp_path, f"worker-3-{inc}.log")
        touch(tmp_path, f"worker-3-{inc}.pid", f"{exited_pid() if inc == 1 else 'x'}\n")
    launcher = LocalProcessLauncher(tmp_path)
    launcher.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"worker-3-{i}.log" for i in (3, 4, 5)]


ROTATING = """
import os, sys
from pathlib import Path
from actors.worker_files import LogBound
bound = LogBound(Path(sys.argv[1]), max_bytes=2000)
print("a" * 999, flush=True)
assert not bound.check()  # 1000 bytes: not past half
print("b" * 999, flush=True)
assert bound.check()  # 2000 bytes: rotated
os.write(2, b"c" * 9 + b"\\n")  # stderr goes to the new file too
print("d" * 1500, flush=True)
assert bound.check()  # the older part is replaced
print("e", flush=True)
assert not bound.check() and bound.rotations == 2
"""


def test_a_host_log_rotates_once_past_half_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "worker-0-1.log"
    with open(path, "ab") as out:
        subprocess.run(
            [sys.executable, "-c", ROTATING, str(path)],
            stdout=out,
            stderr=out,
            cwd=ROOT,
            check=True,
        )
    assert path.read_text() == "e\n"
    assert (tmp_path / "worker-0-1.log.1").read_text() == "c" * 9 + "\n" + "d" * 1500 + "\n"


def test_a_log_bound_leaves_other_stdouts_alone(tmp_path: Path) -> None:
    script = ROTATING.split("bound = ")[0] + (
        "bound = LogBound(Path(sys.argv[1]), max_bytes=10)\n"
        "print('x' * 100, flush=True)\n"
        "assert not bound.check()\n"
    )
    other = tmp_path / "other.txt"
    with open(other, "wb") as out:  # stdout is another file than the host's log
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "worker-0-1.log")],
            stdout=out,
            cwd=ROOT,
            check=True,
        )
    assert other.read_text() == "x" * 100 + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt"]


def test_a_host_removes_its_pid_file_only_while_it_names_that_host(tmp_path: Path) -> None:
    """A relaunch of the same worker and incarnation writes the same pid file: the earlier host,
    exiting later, must not take the running one's file with it."""
    p = wf.pid_path(tmp_path / "workers", 3, 7)
    wf.write_own(p)
    assert p.read_text() == f"{os.getpid()}\n" and wf.host_alive(p)
    assert [f.kind for f in wf.scan(p.parent)] == ["pid"]  # no temporary left
    p.write_text("1\n")  # the relaunched host's
    wf.remove_own(p)
    assert p.read_text() == "1\n"
    wf.write_own(p)
    wf.remove_own(p)
    assert not p.exists()
