"""Property tests: any valid update sequence survives the log; invalid updates change nothing."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pearl.core.errors import InvariantViolation
from pearl.core.fold import apply, apply_to, replay
from pearl.core.state import ClusterState, validate
from pearl.log import FileLog, MemoryLog, state_from_snapshot, state_to_snapshot

from .strategies import candidate, valid_records


def fast(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def logged(draw: st.DrawFn) -> tuple[list[Any], list[int], set[int], int]:
    """Records, batch boundaries, which boundaries get a snapshot, and a replay point."""
    records = draw(valid_records())
    cuts = sorted(set(draw(st.lists(st.integers(1, len(records)), max_size=6))) | {len(records)})
    snaps = set(draw(st.lists(st.sampled_from(cuts), max_size=3)))
    until = draw(st.integers(0, len(records)))
    return records, cuts, snaps, until


def write(log: Any, records: list[Any], cuts: list[int], snaps: set[int]) -> None:
    start = 0
    for cut in cuts:
        assert log.append(records[start:cut]) == list(range(start + 1, cut + 1))
        if cut in snaps:
            log.write_snapshot(replay(records[:cut]), {"cut": cut})
        start = cut


@fast(60)
@given(logged())
def test_valid_sequences_replay_to_the_same_table_after_reopening(case: Any) -> None:
    records, cuts, snaps, until = case
    expected = replay(records)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log"
        with FileLog(path, segment_bytes=512) as log:
            write(log=log, records=records, cuts=cuts, snaps=snaps)
        memory = MemoryLog()
        write(log=memory, records=records, cuts=cuts, snaps=snaps)
        for log in (FileLog(path), MemoryLog(memory.storage)):
            with log:
                assert [r for _, r in log.read()] == records
                loaded = log.load()
                assert loaded.state == expected
                assert loaded.snapshot_seq == max(snaps, default=0)
                assert log.load(until=until).state == replay(records[:until])


def builder_vars(b: Any) -> dict[str, Any]:
    return {k: copy.copy(v) for k, v in vars(b).items()}


@fast(300)
@given(st.data())
def test_every_update_is_all_or_nothing(data: st.DataObject) -> None:
    records = data.draw(valid_records(max_tries=30))
    state = replay(records)
    b = state.thaw()
    for _ in range(8):
        r = data.draw(candidate(b))
        before_state, before = b.freeze(), builder_vars(b)
        try:
            apply_to(b, r)
        except InvariantViolation:
            assert builder_vars(b) == before  # nothing changed, not even the private indexes
            assert b.freeze() == before_state
            continue
        after = b.freeze()
        validate(after)  # every accepted update keeps every invariant
        assert after.seq == before_state.seq + 1
        # the builder and the pure one-record apply agree, and the input is left alone
        frozen = copy.deepcopy(state_to_snapshot(before_state))
        assert apply(before_state, r) == after
        assert state_to_snapshot(before_state) == frozen


@fast(100)
@given(valid_records())
def test_snapshot_mapping_round_trips(records: list[Any]) -> None:
    state = replay(records)
    assert state_from_snapshot(copy.deepcopy(state_to_snapshot(state))) == state
    assert state_from_snapshot(state_to_snapshot(ClusterState())) == ClusterState()
