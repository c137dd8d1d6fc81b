"""Counterfactual replay (``pearl simulate --from-log``) on logs recorded by driving the real
controller: self-replay reproduces the log, other policies differ, bad logs are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pearl import config as pconfig
from pearl.core import commands as cmd
from pearl.core import events as ev
from pearl.core.controller import Controller
from pearl.core.errors import LogCorrupted
from pearl.core.fold import replay as fold
from pearl.core.profile import prior_profile
from pearl.log import FileLog
from pearl.log.verify import verify
from pearl.sim import fromlog
from pearl.sim.counterfactual import choice, policy_of, recorded_summary, replay
from pearl.sim.replay_report import compare

ROOT = Path(__file__).resolve().parents[2]
SETS = ["cluster.training_gpus=0-3", "cluster.reserved_gpus=4-7", "cluster.preemptible_gpus=8-15"]
CFG = pconfig.load(ROOT / "configs" / "sim-32.toml", SETS)
OWN = policy_of(CFG)
STEP_COMMANDS = (cmd.StartWorker, cmd.ActivateWorker, cmd.StopWorker, cmd.DeactivateWorker,
                 cmd.SetRole, cmd.LendTraining, cmd.ReclaimTraining)  # fmt: skip


def telemetry(step: int, makespan_s: float, **changes: Any) -> ev.Telemetry:
    """A step summary around the priors; ``changes`` move the profile (and the decisions)."""
    p = prior_profile(CFG)
    fields: dict[str, Any] = dict(
        step=step, batch=p.B, S=p.S, delta_L=p.delta_L, r=p.r, theta=p.theta, A=p.A, b=p.b,
        t_prefill=p.t_prefill, T_env=p.T_env, makespan_s=makespan_s,
    )  # fmt: skip
    fields.update(changes)
    return ev.Telemetry(**fields)


def record(path: Path, script: list[Any], with_telemetry: bool = True) -> list[Any]:
    """Drive a controller like pearld: log every output, answer every step right away (one
    second later), each script entry an input; returns the records."""
    c = CFG.cluster
    init = ev.ClusterInit(
        tp=c.tp,
        training_gpus=c.training_gpus,
        reserved_gpus=c.reserved_gpus,
        preemptible_gpus=c.preemptible_gpus,
    )
    records: list[Any] = [init]
    ctl, now = Controller(OWN), 0.0
    out = ctl.recover(fold(records), prior_profile(CFG), now)
    pending: list[Any] = []

    def take(o: Any) -> Any:
        records.extend(o.records)
        pending.extend(x for x in o.commands if isinstance(x, STEP_COMMANDS))
        return o.state

    s = take(out)
    for event in script:
        if isinstance(event, ev.Telemetry) and not with_telemetry:
            continue
        now += 10.0
        s = take(ctl.handle(s, event, now))
        while pending:
            x = pending.pop(0)
            now += 1.0
            if getattr(x, "background", False):  # a joiner in the background is up
                s = take(
                    ctl.handle(s, cmd.WorkerUp(worker=x.worker, incarnation=x.incarnation), now)
                )
            elif x.plan == cmd.BESIDE:
                s = take(ctl.handle(s, cmd.StepResult(plan=cmd.BESIDE, step=x.step), now))
            elif x.plan > 0 and not getattr(x, "force", False):
                cancel = bool(getattr(x, "cancel", False))
                s = take(
                    ctl.handle(s, cmd.StepResult(plan=x.plan, step=x.step, cancel=cancel), now)
                )
            elif isinstance(x, cmd.StopWorker) and x.worker in s.evicting:
                s = take(
                    ctl.handle(
                        s, cmd.WorkerDown(worker=x.worker, incarnation=0, reason="stopped"), now
                    )
                )
    with FileLog(path, create=True) as log:
        log.append(records)
    return records


SCRIPT: list[Any] = [
    ev.GpusAdded(gpus=(8, 9, 10, 11)),
    telemetry(1, 120.0),
    ev.TrainingBegin(step=1),
    ev.TrainingFinished(step=1, weights_version=1),
    telemetry(2, 100.0, theta=2.0, b=0.0),  # a decode-heavy workload: the ratio moves
    ev.TrainingBegin(step=2),
    ev.GpusAdded(gpus=(12, 13, 14, 15)),
    ev.TrainingFinished(step=2, weights_version=2),
    telemetry(3, 90.0, t_prefill=0.0),
    ev.GpusReclaimed(gpus=(12, 13)),
    ev.TrainingBegin(step=3),
    ev.TrainingFinished(step=3, weights_version=3),
    telemetry(4, 95.0),
]


def test_self_replay_reproduces_every_controller_record(tmp_path: Path) -> None:
    recorded = record(tmp_path / "log", SCRIPT)
    rec = fromlog.read(tmp_path / "log")
    assert rec.clock == "telemetry" and len(rec.telemetry) == 4
    name, policy, elastic = choice("own", OWN)
    run = replay(rec=rec, name=name, policy=policy, elastic=elastic, prior=prior_profile(CFG))
    assert run.errors == [] and run.diverged_at is None
    assert [r for _, r in run.records] == recorded[rec.start - 1 :]
    summary = recorded_summary(rec)
    assert run.summary.decisions() == summary.decisions()
    assert summary.plans and summary.borrow_windows


def test_other_policies_decide_otherwise_and_the_document_says_how(tmp_path: Path) -> None:
    record(tmp_path / "log", SCRIPT)
    rec = fromlog.read(tmp_path / "log")
    doc, summaries = compare(
        rec=rec, own=OWN, prior=prior_profile(CFG), names=["own", "rlboost", "roll"]
    )
    assert set(doc["policies"]) == {"own", "rlboost", "roll"} and "recorded" in summaries
    for part in (doc["recorded"], *doc["policies"].values()):
        assert {"throughput_tok_s", "mode_changes", "ratio_changes", "plans"} <= set(part)
        assert part["throughput_tok_s"] > 0
    own, rlboost, roll = (doc["policies"][k] for k in ("own", "rlboost", "roll"))
    assert own["same_decisions"] and own["vs_recorded"] == 0.0
    assert own["throughput_tok_s"] == doc["recorded"]["throughput_tok_s"]
    assert not rlboost["same_decisions"] and rlboost["borrow_windows"] == []
    assert doc["recorded"]["borrow_windows"]
    # ROLL keeps its reserved workers only: fewer workers, a lower predicted throughput.
    assert roll["throughput_tok_s"] < doc["recorded"]["throughput_tok_s"]
    assert max(c.P + c.D + c.C for _, c in summaries["roll"].timeline) == 2  # reserved 4-7
    assert max(c.P + c.D + c.C for _, c in summaries["recorded"].timeline) > 2
    assert doc["profile"] == "telemetry" and doc["notes"] == []


def test_a_log_without_telemetry_falls_back_to_the_priors_and_says_so(tmp_path: Path) -> None:
    record(tmp_path / "log", SCRIPT, with_telemetry=False)
    rec = fromlog.read(tmp_path / "log")
    assert rec.clock == "sequence" and not rec.telemetry
    doc, _ = compare(rec=rec, own=OWN, prior=prior_profile(CFG), names=["own", "pearl"])
    assert doc["profile"] == "priors" and any("priors" in n for n in doc["notes"])
    assert doc["policies"]["own"]["same_decisions"]
    assert doc["recorded"]["throughput_tok_s"] > 0  # eq. 1-3 on the priors


def test_a_torn_or_corrupt_log_is_refused_as_pearl_log_verify_refuses_it(tmp_path: Path) -> None:
    record(tmp_path / "log", SCRIPT)
    seg = sorted((tmp_path / "log").glob("*.seg"))[-1]
    data = seg.read_bytes()
    seg.write_bytes(data + bytes(100))  # torn tail
    with pytest.raises(LogCorrupted) as e:
        fromlog.read(tmp_path / "log")
    assert str(e.value) == str(verify(tmp_path / "log")) and "torn tail" in str(e.value)
    broken = bytearray(data)
    broken[20] ^= 0xFF  # mid-log CRC mismatch: verify itself raises
    seg.write_bytes(broken)
    with pytest.raises(LogCorrupted) as e:
        fromlog.read(tmp_path / "log")
    with pytest.raises(LogCorrupted) as e2:
        verify(tmp_path / "log")
    assert str(e.value) == str(e2.value)
