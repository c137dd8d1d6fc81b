"""A simulated trajectory's phases: the transition table, and real runs that stay inside it."""

from __future__ import annotations

from typing import Any

import pytest

from pearl.core.errors import InvariantViolation
from pearl.sim.static import run_static
from pearl.sim.trajectory import NEXT, Phase, Traj
from pearl.sim.workload import TrajectorySpec, WorkloadParams
from tests.graphs import reachable


def test_every_phase_is_reachable_from_wait_and_only_done_is_final() -> None:
    assert reachable(NEXT, Phase.WAIT) == set(Phase)
    assert [p for p in Phase if not NEXT[p]] == [Phase.DONE]


def test_a_transition_outside_the_table_is_refused() -> None:
    tr = Traj(0, TrajectorySpec(group=0, new=(100,), gen=(10,), env=(0.0,)))
    with pytest.raises(InvariantViolation, match="WAIT -> DECODING"):
        tr.to(Phase.DECODING)
    assert tr.phase is Phase.WAIT


@pytest.mark.parametrize("workers", [(2, 0, 0), (0, 1, 1)], ids=["colocated", "1P1D"])
def test_simulated_runs_take_only_allowed_transitions(
    workers: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: set[tuple[Phase, Phase]] = set()
    to = Traj.to

    def spy(self: Traj, phase: Phase) -> None:
        taken.add((self.phase, phase))
        to(self, phase)

    monkeypatch.setattr(Traj, "to", spy)
    wl: Any = WorkloadParams(batch=8, group_size=4, turns=4.0)
    run_static("qwen3-8b", *workers, workload=wl, batches=1)
    assert all(b in NEXT[a] for a, b in taken)
    expected = {
        (Phase.WAIT, Phase.QUEUED),
        (Phase.QUEUED, Phase.PREFILLING),
        (Phase.DECODING, Phase.DONE),
    }
    expected.add(
        (Phase.PREFILLING, Phase.XFER) if workers[1] else (Phase.PREFILLING, Phase.DECODING)
    )
    assert expected <= taken
