"""A disk that fails a write or a sync: the log is left exactly as it was before the append.

Every append either is acknowledged and replayed after a restart, or raises and is never
replayed: no byte offset at which the disk fills, no failed sync, breaks that. Once the disk
takes writes again the same log object takes appends again.
"""

from __future__ import annotations

import errno
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pearl.core import events as ev
from pearl.core.errors import LogError, LogWriteFailed
from pearl.log import FileLog, failpoints, segments
from pearl.testing.workload import realistic

RECORDS = realistic(40, seed=7)


@pytest.fixture(autouse=True)
def healthy_disk() -> Iterator[None]:
    yield
    failpoints.disk()


def replayed(path: Path) -> list[object]:
    with FileLog(path, readonly=True) as log:
        assert log.pending_repair is None  # what a failure left is never a torn tail
        return [r for _, r in log.read()]


def segment_bytes(path: Path) -> bytes:
    (seg,) = sorted(path.glob("*.seg"))
    return seg.read_bytes()


def batch_size(tmp_path: Path, base: list[object], batch: list[object]) -> int:
    with FileLog(tmp_path / "measure") as log:
        log.append(base)
        before = len(segment_bytes(tmp_path / "measure"))
        log.append(batch)
    return len(segment_bytes(tmp_path / "measure")) - before


def test_enospc_at_every_byte_offset_of_a_batch_leaves_the_log_as_it_was(tmp_path: Path) -> None:
    base, batch = RECORDS[:3], RECORDS[3:7]
    size = batch_size(tmp_path, base, batch)
    path = tmp_path / "log"
    with FileLog(path) as log:
        log.append(base)
        before = segment_bytes(path)
        for space in range(size):
            failpoints.disk(space=space)
            with pytest.raises(LogWriteFailed, match="No space left on device"):
                log.append(batch)
            assert log.last_seq == 3
            assert segment_bytes(path) == before, f"ENOSPC after {space} bytes left bytes behind"
        failpoints.disk(space=size)  # exactly enough: the batch fits, with no reopen
        assert log.append(batch) == [4, 5, 6, 7]
        failpoints.disk()
        assert log.append(RECORDS[7:8]) == [8]
    assert replayed(path) == RECORDS[:8]


def test_a_failed_sync_is_undone_and_the_log_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with FileLog(path) as log:
        log.append(RECORDS[:3])
        before = segment_bytes(path)
        failpoints.disk(sync_errno=errno.EIO)
        with pytest.raises(LogWriteFailed, match=r"not logged: Input/output error \(EIO\)"):
            log.append(RECORDS[3:5])
        assert segment_bytes(path) == before and log.last_seq == 3
        failpoints.disk()
        assert log.append(RECORDS[3:5]) == [4, 5]  # the same numbers, given again
    assert replayed(path) == RECORDS[:5]


def test_a_failed_cut_poisons_until_reopen_cuts_every_unacknowledged_frame(
    tmp_path: Path,
) -> None:
    base, batch = RECORDS[:3], RECORDS[3:6]
    first = batch_size(tmp_path, base, batch[:1])
    path = tmp_path / "log"
    with FileLog(path) as log:
        log.append(base)
        before = segment_bytes(path)
        # One whole frame of the batch reaches the disk, and the cut back fails: a scan on
        # open would keep that frame, though it was never acknowledged.
        failpoints.disk(space=first + 2, truncate_errno=errno.EIO)
        with pytest.raises(LogWriteFailed, match="unknown until the log is reopened"):
            log.append(batch)
        failpoints.disk()
        with pytest.raises(LogError, match="unknown until the log is reopened"):
            log.append(batch)
        log.reopen()
        assert segment_bytes(path) == before
        assert log.append(batch) == [4, 5, 6]
    assert replayed(path) == RECORDS[:6]


def test_reopen_while_the_disk_still_refuses_says_so_and_keeps_the_poison(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with FileLog(path) as log:
        log.append(RECORDS[:2])
        failpoints.disk(space=3, truncate_errno=errno.EIO)
        with pytest.raises(LogWriteFailed):
            log.append(RECORDS[2:3])
        with pytest.raises(LogError, match="cannot reopen the log: Input/output error"):
            log.reopen()
        failpoints.disk()
        log.reopen()
        assert log.append(RECORDS[2:3]) == [3]
    assert replayed(path) == RECORDS[:3]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_concurrent_appends_through_a_disk_full_window(tmp_path: Path, seed: int) -> None:
    """Eight writers, the disk fills at a random byte and frees again while they write:
    exactly the acknowledged records are replayed, each once, in sequence order."""
    rng = random.Random(seed)
    path = tmp_path / "log"
    acked: dict[int, object] = {}
    failed: list[object] = []
    lock = threading.Lock()
    first_failure = threading.Event()
    start = threading.Barrier(9)

    def writer(k: int) -> None:
        start.wait()
        for i in range(40):
            rec = ev.WeightsPublished(version=k * 1000 + i)
            try:
                (seq,) = log.append([rec])
            except LogWriteFailed:
                with lock:
                    failed.append(rec)
                first_failure.set()
                continue
            with lock:
                acked[seq] = rec

    with FileLog(path) as log:
        threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        failpoints.disk(space=rng.randrange(0, 4000))
        start.wait()
        first_failure.wait(30)
        failpoints.disk()
        for t in threads:
            t.join()
        assert failed, "the disk never filled"
        assert sorted(acked) == list(range(1, len(acked) + 1))
        assert log.append([ev.WeightsPublished(version=10**6)]) == [len(acked) + 1]
    assert replayed(path) == [acked[s] for s in sorted(acked)] + [
        ev.WeightsPublished(version=10**6)
    ]


def test_a_failed_rotation_does_not_fail_the_durable_append(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "log"
    real = segments.create_segment
    calls = []

    def full(p: Path, first_seq: int) -> segments.Segment:
        calls.append(first_seq)
        if len(calls) == 1:
            (p / segments.segment_name(first_seq)).touch()  # created, then the disk filled
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(p, first_seq)

    with FileLog(path, segment_bytes=200) as log:
        monkeypatch.setattr(segments, "create_segment", full)
        assert log.append(RECORDS[:6]) == list(range(1, 7))  # durable: rotation comes later
        assert log.append(RECORDS[6:7]) == [7]
        assert len(log.segments) == 2
    assert replayed(path) == RECORDS[:7]


def test_a_snapshot_on_a_full_disk_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with FileLog(path) as log:
        seqs = log.append(RECORDS[:5])
        state = log.load().state
        assert state.seq == seqs[-1]
        failpoints.disk(space=10)
        with pytest.raises(OSError, match="No space left"):
            log.write_snapshot(state)
        assert not list(path.glob("snapshot-*")) and log.snapshots() == []
        failpoints.disk()
        log.write_snapshot(state)
        assert log.snapshots() == [5]


def test_the_flag_file_opens_and_closes_a_disk_full_window(tmp_path: Path) -> None:
    flag = tmp_path / "disk-full"
    failpoints.arm_disk_flag(str(flag))
    try:
        with FileLog(tmp_path / "log") as log:
            log.append(RECORDS[:1])
            flag.write_text("full")
            with pytest.raises(LogWriteFailed, match="No space left"):
                log.append(RECORDS[1:2])
            flag.write_text("eio")  # every sync fails, the cut's too: poisoned until reopened
            with pytest.raises(LogWriteFailed, match="Input/output error"):
                log.append(RECORDS[1:2])
            with pytest.raises(LogError, match="cannot reopen"):
                log.reopen()
            flag.unlink()
            log.reopen()
            assert log.append(RECORDS[1:2]) == [2]
    finally:
        failpoints.arm_disk_flag(None)
    assert not failpoints.DISK
