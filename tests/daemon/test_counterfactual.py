"""``pearl simulate --from-log`` on a run recorded by a real pearld on sim engines: replayed under
its own policy it makes exactly the recorded decisions; under RLBoost+ it borrows nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pearl import config as pconfig
from pearl.cli import main
from pearl.core import events as ev
from pearl.core.profile import prior_profile
from pearl.sim import fromlog
from pearl.sim.counterfactual import choice, policy_of, replay
from tests.daemon.conftest import CONFIG, SMALL, Pearld

pytestmark = pytest.mark.slow


def test_a_recorded_pearld_run_replays_exactly_under_its_own_policy(
    pearld_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d: Pearld = pearld_factory()
    d.settled(60)
    script: list[Any] = [
        ev.GpusAdded(gpus=(8, 9, 10, 11)),
        ev.TrainingBegin(step=1),
        ev.TrainingFinished(step=1, weights_version=1),
        ev.GpusAdded(gpus=(12, 13, 14, 15)),
        ev.GpusReclaimed(gpus=(12, 13)),
        ev.TrainingBegin(step=2),
        ev.TrainingFinished(step=2, weights_version=2),
        ev.GpusReclaimed(gpus=(8, 9)),
    ]
    for i, event in enumerate(script):
        d.event(event)
        if i != 3:  # the reclaim after it lands while the expansion is in flight
            d.settled(60)
    d.settled(60)
    assert d.stop() == 0

    cfg = pconfig.load(CONFIG, SMALL)
    rec = fromlog.read(d.state)
    name, policy, elastic = choice("own", policy_of(cfg))
    run = replay(rec=rec, name=name, policy=policy, elastic=elastic, prior=prior_profile(cfg))
    assert run.errors == [] and run.diverged_at is None
    assert [r for _, r in run.records] == [r for s, r in rec.records if s >= rec.start]

    out = tmp_path / "cf.json"
    sets = [x for s in SMALL for x in ("--set", s)]
    argv = ["simulate", "--from-log", str(d.state), "--config", str(CONFIG), *sets]
    code = main(
        [*argv, "--policy", "own,rlboost", "--json", str(out), "--plot", str(tmp_path / "p")]
    )
    printed = capsys.readouterr().out
    assert code == 0 and "no telemetry" in printed and "same decisions" in printed
    doc = json.loads(out.read_text())
    own, rlboost = doc["policies"]["own"], doc["policies"]["rlboost"]
    assert own["same_decisions"] and own["plans"] == doc["recorded"]["plans"]
    assert own["mode_changes"] == doc["recorded"]["mode_changes"]
    assert own["ratio_changes"] == doc["recorded"]["ratio_changes"]
    assert doc["recorded"]["borrow_windows"] and rlboost["borrow_windows"] == []
    assert (tmp_path / "p" / "roles-from-log.png").stat().st_size > 0
