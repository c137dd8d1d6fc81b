"""Group commit: one sync covers every record waiting, and no append returns before its sync."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import pearl.log.file as file_mod
from pearl.core import events as ev
from pearl.log import FileLog, failpoints, framing


class SlowSync:
    """Stands in for fdatasync: slow enough for appends to pile up; records what it covered."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.synced: list[int] = [0]  # file sizes made durable, in order

    def __call__(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        time.sleep(0.004)  # a slow disk is the point (appends pile up): latency, not a wait
        os.fsync(fd)
        with self.lock:
            self.synced.append(size)


def telemetry(i: int) -> ev.Telemetry:
    return ev.Telemetry(
        step=i,
        batch=1,
        S=1.0,
        delta_L=1.0,
        r=1.0,
        theta=0.0,
        A=0.0,
        b=0.0,
        t_prefill=0.0,
        T_env=0.0,
        makespan_s=1.0,
    )


def frame_ends(path: Path) -> dict[int, int]:
    data, off, ends = path.read_bytes(), 0, {}
    while off < len(data):
        length, _, seq = framing.HEADER.unpack_from(data, off)
        off += framing.HEADER_SIZE + length
        ends[seq] = off
    return ends


@pytest.mark.parametrize("group_commit", [True, False])
def test_appends_return_only_after_their_sync(tmp_path: Path, monkeypatch, group_commit) -> None:
    sync = SlowSync()
    monkeypatch.setattr(file_mod, "_sync", sync)
    log = FileLog(tmp_path / "log", group_commit=group_commit)
    acked: list[tuple[int, int]] = []  # (last seq of an append, durable size when it returned)

    def writer(k: int) -> None:
        for i in range(10):
            seqs = log.append([telemetry(k * 100 + i)])
            with sync.lock:
                acked.append((seqs[-1], sync.synced[-1]))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    ends = frame_ends(tmp_path / "log" / "0000000000000001.seg")
    assert sorted(s for s, _ in acked) == list(range(1, 81)) == sorted(ends)
    for seq, durable in acked:
        assert ends[seq] <= durable, f"seq {seq} acknowledged before it was synced"
    syncs = len(sync.synced) - 1
    if group_commit:
        assert syncs <= 40, f"{syncs} syncs for 80 concurrent appends: nothing was grouped"
    else:
        assert syncs == 80


def test_failpoint_specs_are_checked() -> None:
    for spec in ("before-write", "before-write:0", "nowhere:1", "before-write:x"):
        with pytest.raises(ValueError, match="expected <point>:<n>"):
            failpoints.arm(spec)
    failpoints.arm("before-write:3, after-fsync:1")
    assert failpoints.ACTIVE
    failpoints.hit("before-fsync")  # not armed: no effect
    failpoints.hit("before-write")
    failpoints.hit("before-write")  # the 3rd would exit
    failpoints.arm(None)
    assert not failpoints.ACTIVE


def test_the_sync_observer_hears_every_sync_and_cannot_fail_an_append(
    tmp_path: Path, monkeypatch
) -> None:
    sync = SlowSync()
    monkeypatch.setattr(file_mod, "_sync", sync)
    heard: list[float] = []
    with FileLog(tmp_path / "log", group_commit=False) as log:
        log.on_sync = heard.append
        log.append([telemetry(1), telemetry(2)])
        assert len(heard) == 2 and all(0.004 <= s < 1.0 for s in heard)

        def broken(_: float) -> None:
            raise RuntimeError("observer bug")

        log.on_sync = broken
        assert log.append([telemetry(3)]) == [3]  # durable, and the log is not poisoned
        assert log.append([telemetry(4)]) == [4]
