"""``pearl simulate``: JSON shape, plots, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pearl.cli import main


@pytest.mark.slow
def test_json_shape_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    rc = main(
        [
            "simulate",
            "--segment",
            "S3",
            "--minutes",
            "60",
            "--no-progress",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "png"),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"pearl", "roll", "roll-large", "rlboost+"}
    for p in doc["policies"].values():
        assert isinstance(p["throughput_tok_s"], float) and p["throughput_tok_s"] > 0
        assert isinstance(p["steps"], int) and p["steps"] >= 1
        assert p["invariant_violations"] == 0 and p["late_returns"] == 0
    assert doc["policies"]["roll"]["vs_roll"] == 1.0
    assert doc["trace"]["duration_s"] == 3600.0
    assert list((tmp_path / "png").glob("per-step-*.png"))
    text = capsys.readouterr().out
    assert "vs ROLL" in text and "PEARL over RLBoost+" in text


def test_one_policy_from_a_count_csv(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,gpus\n0,4\n1200,8\n")
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(trace),
                "--minutes",
                "45",
                "--policy",
                "rlboost+",
                "--no-progress",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert list(json.loads(out.read_text())["policies"]) == ["rlboost+"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "/nonexistent.csv"], "does not exist"),
        (["--segment", "S7"], "unknown segment"),
        (["--segment", "S1", "--policy", "pearll"], "unknown policy"),
        (["--segment", "S1", "--model", "qwen3-7b"], "unknown model"),
        ([], "no trace"),
    ],
)
def test_bad_input_is_one_clear_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["simulate", "--no-progress", *argv])
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert len(err.splitlines()) == 1 and message in err and err.startswith("pearl simulate:")
