"""Opening a damaged log: torn tails are backed up and truncated once; anything else refuses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from pearl.core.errors import LogCorrupted, LogError, LogLocked, NotALog
from pearl.core.fold import replay
from pearl.log import FileLog, framing, reader, segments
from pearl.testing.workload import realistic

RECORDS = realistic(80, seed=2)
SEG = "0000000000000001.seg"


def write_log(path: Path, records=RECORDS, **kw) -> None:
    with FileLog(path, **kw) as log:
        for i in range(0, len(records), 5):
            log.append(records[i : i + 5])


def frame_offsets(data: bytes) -> list[int]:
    """Start offset of every frame, plus the end of the last one."""
    offs, off = [], 0
    while off < len(data):
        offs.append(off)
        off += framing.HEADER_SIZE + framing.HEADER.unpack_from(data, off)[0]
    return [*offs, off]


def backups(path: Path) -> list[Path]:
    d = path / segments.REPAIR_DIR
    return sorted(d.iterdir()) if d.exists() else []


@pytest.fixture
def template(tmp_path: Path) -> Path:
    path = tmp_path / "template"
    write_log(path, RECORDS[:30])
    return path


def test_truncation_sweep_over_the_last_two_records(template: Path, tmp_path: Path) -> None:
    data = (template / SEG).read_bytes()
    offs = frame_offsets(data)
    assert len(offs) == 31
    for cut in range(offs[-3], len(data) + 1):
        whole = sum(1 for o in offs[1:] if o <= cut)  # records that end at or before the cut
        d = tmp_path / f"cut{cut}"
        shutil.copytree(template, d)
        with open(d / SEG, "r+b") as f:
            f.truncate(cut)
        with FileLog(d) as log:
            assert log.last_seq == whole, cut
            assert [r for _, r in log.read()] == RECORDS[:whole], cut
            torn = cut not in offs
            assert (log.repaired is not None) == torn, cut
            assert len(backups(d)) == torn, cut
            assert (d / SEG).stat().st_size == offs[whole]
            more = RECORDS[whole : whole + 10]  # the records that follow validly
            for r in more:
                log.append([r])
        with FileLog(d) as log:  # the second open finds nothing to repair
            assert log.repaired is None and len(backups(d)) == torn
            assert [r for _, r in log.read()] == RECORDS[:whole] + more, cut
            assert log.load().state.seq == whole + len(more)
        shutil.rmtree(d)


def test_zeroed_block_at_the_end_is_backed_up_and_truncated_once(template: Path) -> None:
    seg = template / SEG
    good = seg.read_bytes()
    seg.write_bytes(good + bytes(512))
    with FileLog(template, readonly=True) as ro:  # a reader reports and changes nothing
        assert ro.pending_repair is not None and ro.pending_repair.offset == len(good)
        assert ro.last_seq == 30
    assert seg.stat().st_size == len(good) + 512 and backups(template) == []
    with FileLog(template) as log:
        assert log.repaired is not None and "bad record length 0" in str(log.repaired)
        assert log.repair_backup is not None
        assert log.repair_backup.read_bytes() == good + bytes(512)
        assert seg.read_bytes() == good
        assert [r for _, r in log.read()] == RECORDS[:30]
    with FileLog(template) as log:
        assert log.repaired is None
    assert len(backups(template)) == 1


def test_last_record_with_a_bad_crc_is_a_torn_tail(template: Path) -> None:
    seg = template / SEG
    data = bytearray(seg.read_bytes())
    offs = frame_offsets(bytes(data))
    data[offs[-2] + framing.HEADER_SIZE + 1] ^= 0x01
    seg.write_bytes(data)
    with FileLog(template) as log:
        assert log.repaired is not None and "CRC mismatch" in log.repaired.problem
        assert log.last_seq == 29


@pytest.mark.parametrize("where", ["length", "crc", "seq", "payload"])
def test_flipped_bit_in_the_middle_refuses_and_touches_nothing(template: Path, where: str) -> None:
    seg = template / SEG
    data = bytearray(seg.read_bytes())
    offs = frame_offsets(bytes(data))
    victim = offs[12]
    pos = victim + {"length": 0, "crc": 5, "seq": 9, "payload": framing.HEADER_SIZE + 3}[where]
    data[pos] ^= 0x10
    seg.write_bytes(data)
    before = sorted(os.listdir(template))
    for readonly in (True, False):
        with pytest.raises(LogCorrupted) as err:
            FileLog(template, readonly=readonly)
        assert str(seg) in str(err.value) and f"byte offset {victim} " in str(err.value)
        assert "valid records follow" in str(err.value)
    assert seg.read_bytes() == bytes(data)
    assert sorted(os.listdir(template)) == before  # no repair directory, nothing new


def test_flipped_bit_refusal_is_stable(template: Path) -> None:
    seg = template / SEG
    data = bytearray(seg.read_bytes())
    data[frame_offsets(bytes(data))[3] + 20] ^= 0x04
    seg.write_bytes(data)
    for _ in range(2):
        with pytest.raises(LogCorrupted):
            FileLog(template)
    assert seg.read_bytes() == bytes(data)


def test_sequence_break_refuses(tmp_path: Path) -> None:
    path = tmp_path / "log"
    write_log(path, RECORDS[:3])
    frames = [
        framing.frame(s, framing.pack(r))
        for s, r in ((1, RECORDS[0]), (2, RECORDS[1]), (4, RECORDS[2]))
    ]
    (path / SEG).write_bytes(b"".join(frames))
    with pytest.raises(LogCorrupted, match="sequence 4 where 3 was expected"):
        FileLog(path)


def test_segments_rotate_and_must_chain(tmp_path: Path) -> None:
    path = tmp_path / "log"
    write_log(path, RECORDS, segment_bytes=1024)
    with FileLog(path, segment_bytes=1024) as log:
        segs = log.segments
        assert len(segs) >= 3
        assert all(s.path.name == segments.segment_name(s.first_seq) for s in segs)
        assert all(a.last_seq + 1 == b.first_seq for a, b in zip(segs, segs[1:], strict=False))
        assert log.load().state == replay(RECORDS)
        assert [s for s, _ in log.read(segs[1].first_seq - 1, segs[1].first_seq + 1)] == [
            segs[1].first_seq - 1,
            segs[1].first_seq,
            segs[1].first_seq + 1,
        ]
    middle = segs[1].path
    data = middle.read_bytes()
    middle.write_bytes(data[:-3])  # damage at the end of a segment that is not the last
    with pytest.raises(LogCorrupted, match="later segments follow"):
        FileLog(path)
    middle.unlink()
    with pytest.raises(LogCorrupted, match=f"expected {middle.name}"):
        FileLog(path, readonly=True)
    segs[0].path.unlink()
    with pytest.raises(LogCorrupted, match="a log starts at seq 1"):
        FileLog(path)


def test_one_writer_at_a_time(tmp_path: Path, open_file_log) -> None:
    log = open_file_log()
    log.append(RECORDS[:2])
    with pytest.raises(LogLocked, match=f"pid {os.getpid()}"):
        FileLog(tmp_path / "log")
    with FileLog(tmp_path / "log", readonly=True) as ro:  # readers take no lock
        assert ro.last_seq == 2
        with pytest.raises(LogError, match="read-only"):
            ro.append(RECORDS[2:3])
    code = (
        f"from pearl.log import FileLog, LogLocked\ntry:\n FileLog({str(tmp_path / 'log')!r})\n"
        "except LogLocked as e:\n print('locked:', e); raise SystemExit(3)"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.returncode == 3, child.stderr
    log.close()
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stdout + child.stderr


def test_not_a_log(tmp_path: Path) -> None:
    with pytest.raises(NotALog, match="no such directory"):
        FileLog(tmp_path / "missing", readonly=True)
    with pytest.raises(NotALog, match="no such directory"):
        FileLog(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("hello")
    with pytest.raises(NotALog, match="holds other files"):
        FileLog(tmp_path / "other")
    with pytest.raises(NotALog, match="no PEARL-LOG file"):
        FileLog(tmp_path / "other", readonly=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotALog, match="not a directory"):
        FileLog(tmp_path / "file")
    FileLog(tmp_path / "new").close()
    (tmp_path / "new" / segments.MARKER).write_text("pearl-log 99\n")
    with pytest.raises(LogError, match="format 99"):
        FileLog(tmp_path / "new")


def test_stray_snapshot_temp_file_is_removed_by_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "log"
    write_log(path, RECORDS[:10])
    stray = path / "snapshot-0000000000000010.snap.tmp"
    stray.write_bytes(b"half a snapshot")
    with FileLog(path, readonly=True) as ro:
        assert ro.snapshots() == [] and ro.load().state == replay(RECORDS[:10])
    assert stray.exists()
    FileLog(path).close()
    assert not stray.exists()


def test_a_damaged_snapshot_falls_back_to_an_older_one_then_to_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "log"
    write_log(path, RECORDS[:30])
    with FileLog(path) as log:
        for seq in (10, 20, 25):
            log.write_snapshot(replay(RECORDS[:seq]))
    snap = {seq: path / f"snapshot-{seq:016d}.snap" for seq in (10, 20, 25)}
    whole = replay(RECORDS[:30])
    damages = {
        25: lambda b: b[:-1] + bytes([b[-1] ^ 1]),  # a flipped bit
        20: lambda b: b[:7],  # shorter than its header
        10: lambda b: b"",  # empty
    }
    expected = {25: 20, 20: 10, 10: 0}  # where replay starts once each is damaged, newest first
    for seq, damage in damages.items():
        snap[seq].write_bytes(damage(snap[seq].read_bytes()))
        caplog.clear()
        with FileLog(path) as log:
            loaded = log.load()
        assert loaded.state == whole and loaded.snapshot_seq == expected[seq]
        instead = f"seq {expected[seq]}" if expected[seq] else "the start of the log"
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warned[-1].startswith(f"{snap[seq]}: ") and warned[-1].endswith(f"{instead} instead")
    with FileLog(path, readonly=True) as log:  # until: only snapshots at or before it count
        assert log.load(22).state == replay(RECORDS[:22])


def test_a_snapshot_ahead_of_the_log_refuses(tmp_path: Path) -> None:
    path = tmp_path / "log"
    write_log(path, RECORDS[:10])
    with FileLog(path) as log:
        log.write_snapshot(replay(RECORDS[:8]))
    snap = path / "snapshot-0000000000000008.snap"
    os.rename(snap, path / "snapshot-0000000000000011.snap")
    with pytest.raises(LogCorrupted, match="ahead of the log"):
        FileLog(path)


@pytest.mark.parametrize("victim_index", [0, 12, 29])
def test_a_checksummed_frame_that_is_no_record_is_named_by_replay(
    template: Path, victim_index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening verifies framing and CRCs only; replay decodes many payloads in one call, and a
    payload that is valid msgpack but no record is still reported with its own seq and offset."""
    monkeypatch.setattr(reader, "CHUNK", 5)  # several chunks in 30 records
    seg = template / SEG
    data = bytes(seg.read_bytes())
    offs = frame_offsets(data)
    victim, seq = offs[victim_index], victim_index + 1
    bogus = framing.frame(seq, msgspec.msgpack.encode({"kind": "no-such-kind", "v": 1}))
    end = offs[victim_index + 1]
    seg.write_bytes(data[:victim] + bogus + data[end:])
    with FileLog(template, readonly=True) as log:
        seen = []
        with pytest.raises(LogCorrupted) as err:
            for s, _record in log.read():
                seen.append(s)
        assert f"record seq {seq} at byte offset {victim} does not decode" in str(err.value)
        with pytest.raises(LogCorrupted, match=f"record seq {seq} at byte offset {victim} "):
            log.load()
        if seq > 1:  # what precedes it in its own segment still reads
            assert [s for s, _ in log.read(1, seq - 1)] == list(range(1, seq))


def test_replay_in_chunks_reads_every_range(
    template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunked decoding hands out each record once, in order, for any start and end."""
    with FileLog(template, readonly=True) as log:
        whole = list(log.read())
        assert [s for s, _ in whole] == list(range(1, 31))
        monkeypatch.setattr(reader, "CHUNK", 4)
        for start, until in ((1, 30), (1, 1), (4, 4), (3, 9), (8, 30), (30, 30), (5, 8)):
            assert list(log.read(start, until)) == whole[start - 1 : until]
