"""One suite, both stores: what every EventLog must do (MemoryLog and FileLog alike)."""

from __future__ import annotations

import threading

import pytest

from pearl.core import events as ev
from pearl.core.errors import LogError, SchemaError
from pearl.core.fold import replay
from pearl.core.state import ClusterState
from pearl.testing.workload import realistic

from .conftest import Store

RECORDS = realistic(300, seed=1)


def fill(log, records=RECORDS, batch=7):
    seqs = []
    for i in range(0, len(records), batch):
        seqs += log.append(records[i : i + batch])
    return seqs


def test_empty_log(store: Store) -> None:
    log = store.open()
    assert log.last_seq == 0
    assert list(log.read()) == []
    loaded = log.load()
    assert loaded.state == ClusterState() and loaded.snapshot_seq == 0 and loaded.extra is None
    assert log.append([]) == []


def test_append_numbers_records_from_one_without_gaps(store: Store) -> None:
    log = store.open()
    assert log.append(RECORDS[:3]) == [1, 2, 3]
    assert log.append(RECORDS[3:4]) == [4]
    assert log.append(RECORDS[4:10]) == list(range(5, 11))
    assert log.last_seq == 10
    assert list(log.read()) == list(enumerate(RECORDS[:10], start=1))


def test_read_ranges(store: Store) -> None:
    log = store.open()
    fill(log)
    assert [s for s, _ in log.read(5, 9)] == [5, 6, 7, 8, 9]
    assert [s for s, _ in log.read(299)] == [299, 300]
    assert list(log.read(301)) == []
    assert [s for s, _ in log.read(298, 10_000)] == [298, 299, 300]
    assert list(log.read(0, 2)) == [(1, RECORDS[0]), (2, RECORDS[1])]
    assert list(log.read(7, 6)) == []


def test_load_equals_full_fold(store: Store) -> None:
    log = store.open()
    fill(log)
    loaded = log.load()
    assert loaded.state == replay(RECORDS)
    assert loaded.state.seq == 300 and loaded.snapshot_seq == 0


def test_snapshot_plus_tail_equals_full_fold(store: Store) -> None:
    log = store.open()
    fill(log, RECORDS[:120])
    log.write_snapshot(replay(RECORDS[:120]), {"profile": {"theta": 0.25}, "steps": [1, 2]})
    fill(log, RECORDS[120:])
    seen: list[int] = []
    loaded = log.load(visit=lambda seq, rec: seen.append(seq))
    assert loaded.snapshot_seq == 120
    assert loaded.extra == {"profile": {"theta": 0.25}, "steps": [1, 2]}
    assert loaded.state == replay(RECORDS)
    assert seen == list(range(121, 301))  # the tail, and only the tail, in order


def test_load_until_uses_the_latest_snapshot_at_or_before(store: Store) -> None:
    log = store.open()
    fill(log)
    for s in (50, 200):
        log.write_snapshot(replay(RECORDS[:s]))
    assert log.snapshots() == [50, 200]
    for until, snap in ((0, 0), (1, 0), (49, 0), (50, 50), (199, 50), (200, 200), (300, 200)):
        loaded = log.load(until=until)
        assert loaded.snapshot_seq == snap, until
        assert loaded.state == replay(RECORDS[:until]), until


def test_load_until_past_the_end_is_refused(store: Store) -> None:
    log = store.open()
    fill(log, RECORDS[:5])
    with pytest.raises(LogError, match="holds seq 1..5"):
        log.load(until=6)


def test_snapshot_of_an_undurable_seq_is_refused(store: Store) -> None:
    log = store.open()
    fill(log, RECORDS[:5])
    with pytest.raises(LogError, match="durable to seq 5"):
        log.write_snapshot(replay(RECORDS[:6]))
    assert log.snapshots() == []


def test_reopen_preserves_records_and_snapshots(store: Store) -> None:
    log = store.open()
    fill(log, RECORDS[:100])
    log.write_snapshot(replay(RECORDS[:60]), {"k": 1})
    log = store.reopen(log)
    assert log.last_seq == 100
    assert list(log.read()) == list(enumerate(RECORDS[:100], start=1))
    assert log.snapshots() == [60]
    fill(log, RECORDS[100:])
    log = store.reopen(log)
    loaded = log.load()
    assert (loaded.state, loaded.extra, loaded.snapshot_seq) == (replay(RECORDS), {"k": 1}, 60)


def test_old_snapshots_are_pruned(store: Store) -> None:
    log = store.open(keep_snapshots=2)
    fill(log, RECORDS[:40])
    for s in (10, 20, 30, 40):
        log.write_snapshot(replay(RECORDS[:s]))
    assert log.snapshots() == [30, 40]
    assert store.reopen(log, keep_snapshots=2).snapshots() == [30, 40]


def test_oversize_and_unencodable_records_are_refused_whole(store: Store) -> None:
    log = store.open(max_record=1000)
    log.append(RECORDS[:2])
    small = ev.WorkerFailed(worker=1, reason="x")
    big = ev.WorkerFailed(worker=1, reason="x" * 1000)
    with pytest.raises(LogError, match="over the 1000-byte limit"):
        log.append([small, big])
    with pytest.raises(SchemaError, match="cannot encode"):
        log.append([small, object()])
    with pytest.raises(SchemaError, match="cannot encode WorkerFailed"):
        log.append([small, ev.WorkerFailed(worker=1, reason=object())])  # fails inside msgpack
    assert log.last_seq == 2 and len(list(log.read())) == 2
    assert log.append([small]) == [3]
    assert list(log.read(3)) == [(3, small)]


def test_closed_log_refuses_calls(store: Store) -> None:
    log = store.open()
    log.append(RECORDS[:1])
    log.close()
    log.close()  # idempotent
    with pytest.raises(LogError, match="closed"):
        log.append(RECORDS[1:2])
    with pytest.raises(LogError, match="closed"):
        log.read()


def test_concurrent_appends_get_unique_contiguous_seqs(store: Store) -> None:
    log = store.open()
    log.append(RECORDS[:1])
    payload = [
        ev.Telemetry(
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
            makespan_s=float(i),
        )
        for i in range(400)
    ]
    got: dict[int, object] = {}
    lock = threading.Lock()

    def writer(k: int) -> None:
        for i in range(k, 400, 8):
            batch = payload[i : i + 1] if i % 3 else [payload[i], payload[i]]
            seqs = log.append(batch)
            assert seqs == list(range(seqs[0], seqs[0] + len(batch)))
            with lock:
                got.update(zip(seqs, batch, strict=True))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(2, log.last_seq + 1))
    assert dict(log.read(2)) == got
    assert dict(store.reopen(log).read(2)) == got
