"""The demo's report: report.json's fields, reward.png and summary.png, the summary table."""

from __future__ import annotations

import json
import types
from pathlib import Path

import msgspec
import pytest

from pearl.core.borrow import Verdict
from pearl.core.status import BorrowCycleStatus
from pearl.demo import app as demo
from pearl.demo.learning import Learning, eval_due, seeded
from pearl.demo.report import summary_table

# Names other tools read from report.json (issue 14 keeps them).
RECORD_FIELDS = (
    "step",
    "mode",
    "N_P",
    "N_D",
    "N_C",
    "predicted_makespan_s",
    "measured_makespan_s",
    "throughput_tok_s",
    "reward",
    "return_s",
    "borrow",
)


def record(step: int, reward: float) -> demo.StepRecord:
    mode = "colocated" if step < 3 else "disaggregated"
    return demo.StepRecord(
        step=step,
        end_s=5.0 * step,
        duration_s=5.0,
        wait_batch_s=1.0,
        train_s=0.5,
        return_s=0.05,
        generated_tokens=400,
        trained_tokens=3000,
        throughput_tok_s=680.0,
        reward=reward,
        loss=0.1,
        version=step,
        mode=mode,
        N_P=0 if step < 3 else 1,
        N_D=0 if step < 3 else 2,
        N_C=3 if step < 3 else 0,
        workers=3,
        predicted_makespan_s=4.0,
        measured_makespan_s=5.0,
        borrow=demo.borrow_record(
            BorrowCycleStatus(
                step=step - 1, window_s=1.0, gate=Verdict.APPROVED, lent=2, served_s=0.5
            )
        ),
    )


SWITCH = {
    "at_s": 42.0,
    "from": "4C",
    "to": "1P3D",
    "plan_s": 2.5,
    "migrated": 7,
    "recomputed_tokens": 900,
    "cause": "rebalance",
    "decision": "best: 1P3D over 4C (gain 12.0% > 10.0%)",
    "predicted_s": 3.1,
}


def test_the_report_holds_evals_records_and_both_new_plots(tmp_path: Path) -> None:
    records = [
        record(s, r)
        for s, r in zip(range(1, 9), (0.1, 0.2, 0.2, 0.3, 0.6, 0.7, 0.8, 0.9), strict=True)
    ]
    timeline = demo.Timeline(0.0)
    for i in range(40):
        timeline.samples.append(
            demo.Sample(
                t=i,
                prefill=1 if i > 15 else 0,
                decode=2 if i > 15 else 0,
                colocated=0 if i > 15 else 3,
                overlap=1 if i % 10 == 5 else 0,
                workers=3,
                reserved=1,
                preemptible=2 if i > 8 else 1,
                phase="training" if i % 5 == 0 else "rollout",
            )
        )
    timeline.events += [
        (1.0, "+1 preemptible (trace 4/12)"),
        (9.0, "+1 preemptible (trace 6/12)"),
        (30.0, "-2 preemptible (trace 2/12)"),
    ]
    evals = [
        {"step": s, "accuracy": a, "solved": int(a * 64), "tasks": 64}
        for s, a in ((0, 0.05), (4, 0.5), (8, 0.9))
    ]
    cfg = types.SimpleNamespace(
        daemon=types.SimpleNamespace(pd="adaptive", borrow="gated"),
        engine=types.SimpleNamespace(torch=types.SimpleNamespace(device_share=0.3)),
        rl=types.SimpleNamespace(seed=3),
    )
    summary = demo.write_report(
        out=tmp_path,
        cfg=cfg,
        records=records,
        timeline=timeline,
        interrupted=False,
        deaths={},
        evals=evals,
        learning={"path": "/cache/x", "cached": True, "seconds": 0.2, "validation": 0.95},
        groups={"started": 40, "delivered": 32, "stale": 4, "failed": 0, "failed_trajectories": 0},
        switches=[SWITCH],
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["switches"] == [SWITCH]
    assert report["evals"] == evals and report["seed"] == 3
    assert all(0 <= e["accuracy"] <= 1 for e in report["evals"])
    for r in report["records"]:
        assert set(RECORD_FIELDS) <= set(r) and 0 <= r["reward"] <= 1
        assert r["borrow"]["gate"] == "approved" and r["borrow"]["served_s"] == 0.5
    assert report["timeline"][16] == {
        "t": 16,
        "prefill": 1,
        "decode": 2,
        "colocated": 0,
        "overlap": 0,
        "workers": 3,
        "reserved": 1,
        "preemptible": 2,
        "phase": "rollout",
    }
    for name in ("reward.png", "summary.png"):
        png = tmp_path / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert str(png) in summary["plots"]

    table = summary_table(report)
    assert "training reward    0.15 -> 0.85" in table  # first two steps -> last two
    assert "held-out accuracy  0.05 -> 0.90 (step 0 -> 8; 64 tasks, greedy)" in table
    assert "1 between steps (0 P/D ratio changes)" in table  # colocated -> disaggregated
    assert "joined 2, reclaimed 2 (trace)" in table and "lent in 8 of 8" in table
    assert "0 lost" in table and "median 20%" in table and "cached (0.2 s)" in table
    assert "at 42 s 4C -> 1P3D in 2.5 s; 7 generations migrated, 900 tokens recomputed" in table


def test_the_seed_fixes_tasks_sampling_and_weights_and_evals_end_the_run() -> None:
    assert seeded((), None) == ()
    assert seeded(("a.b=1",), 5) == ("a.b=1", "rl.seed=5", "engine.torch.seed=5")
    every4 = Learning(eval_every=4)
    assert [s for s in range(1, 11) if eval_due(every4, s, last=10)] == [4, 8, 10]
    assert not eval_due(None, 4, last=10) and not eval_due(Learning(eval_every=0), 10, last=10)


def test_the_return_line_says_what_the_borrow_did() -> None:
    returned_line = demo.returned_line
    served = BorrowCycleStatus(step=2, returning=2, served_s=0.8)
    assert returned_line(3, served, 0.021) == "training step 3: 2 borrowed workers back in 21 ms"
    cut = BorrowCycleStatus(step=3, returning=2, aborted="training-begin")
    assert returned_line(4, cut, 0.03) == (
        "training step 4: borrow cut short before serving (training-begin); "
        "2 workers on their way in back in 30 ms"
    )
    assert returned_line(5, BorrowCycleStatus(step=4, aborted="training-begin"), 0.0) == (
        "training step 5: borrow cancelled before serving (training-begin)"
    )
    assert returned_line(6, None, 0.0) == "training step 6: nothing was lent"


def test_generations_cut_short_while_a_step_trained_are_counted_on_its_record() -> None:
    """A resumption is logged with its abort's time when it completes: each one counts on the
    step that was training when it was aborted (Training Begin -> the step's end), none other."""
    moved = [(10.2, 300), (10.4, 120), (13.0, 50), (16.5, 9)]
    records = [record(1, 0.1), record(2, 0.2), record(3, 0.3)]
    demo.count_cut_short(moved, records, [(10.0, 11.0), (12.0, 12.9), (16.0, 17.0)])
    assert [(r.borrow.migrated, r.borrow.recomputed_tokens) for r in records] == [
        (2, 420),
        (0, 0),  # 13.0 is after step 2 trained: a removal between steps, not counted
        (1, 9),
    ]
    assert demo.borrow_summary(records)["migrated"] == 3
    assert demo.borrow_summary(records)["recomputed_tokens"] == 429


def test_borrow_windows_are_counted_by_verdict_and_abort_cause() -> None:
    def cycle(**fields: object) -> BorrowCycleStatus:
        return msgspec.convert({"step": 1, **fields}, BorrowCycleStatus)

    cut = cycle(window_s=2.0, gate="approved", aborted="training-begin", served_s=0.0)
    other = cycle(window_s=2.0, gate="approved", aborted="step 1 (activate) failed: x")
    records = [record(1, 0.1), record(2, 0.2), record(3, 0.3)]
    records[1].borrow = demo.borrow_record(cut)
    records[2].borrow = demo.borrow_record(other)
    assert demo.borrow_record(cycle(window_s=1.0)).gate is Verdict.NONE
    s = demo.borrow_summary(records)
    assert s["approved"] == 3 and s["served"] == 1 and s["aborted_by_training_begin"] == 1
    with pytest.raises(msgspec.ValidationError):
        cycle(gate="maybe")
