"""``pearl simulate --from-log``: the printed comparison, the JSON names other tools rely on,
and one line on stderr with exit 1 for bad input (the same words as ``pearl log verify``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pearl.cli import main
from pearl.log.verify import verify
from tests.sim.test_counterfactual import ROOT, SCRIPT, SETS, record

CONFIG = str(ROOT / "configs" / "sim-32.toml")
SET_ARGS = [x for s in SETS for x in ("--set", s)]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["simulate", "--no-progress", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("pearl simulate: ")
    return lines[0]


def test_prints_side_by_side_and_writes_the_json(capsys, tmp_path: Path) -> None:
    record(tmp_path / "state" / "log", SCRIPT)  # a state dir stands for its log/
    out = tmp_path / "r.json"
    state = str(tmp_path / "state")
    argv = ["--from-log", state, "--config", CONFIG, *SET_ARGS, "--json", str(out)]
    code, text, err = run(capsys, *argv, "--plot", str(tmp_path / "figs"))
    assert code == 0 and err == "", err
    assert "recorded" in text and "own" in text and "rlboost" in text and "same decisions" in text
    doc = json.loads(out.read_text())
    assert set(doc) >= {"recorded", "policies"}
    assert set(doc["policies"]) == {"own", "pearl", "rlboost", "roll", "colocated"}
    for part in (doc["recorded"], *doc["policies"].values()):
        assert {"throughput_tok_s", "mode_changes", "ratio_changes", "plans"} <= set(part)
    assert doc["policies"]["own"]["same_decisions"]
    assert (tmp_path / "figs" / "roles-from-log.png").stat().st_size > 0


def test_bad_input_is_one_line_and_exit_1(capsys, tmp_path: Path) -> None:
    log = tmp_path / "log"
    record(log, SCRIPT)
    code, _, err = run(capsys, "--from-log", str(log), "--policy", "own,nope")
    assert code == 1 and "unknown policy 'nope'" in error_line(err)
    code, _, err = run(capsys, "--from-log", str(tmp_path / "missing"))
    assert code == 1 and "no such directory" in error_line(err)
    (tmp_path / "plain").mkdir()
    code, _, err = run(capsys, "--from-log", str(tmp_path / "plain"))
    assert code == 1 and "not a PEARL event log" in error_line(err)
    code, _, err = run(capsys, "--set", "daemon.pd=adaptive")
    assert code == 1 and "--from-log only" in error_line(err)
    seg = sorted(log.glob("*.seg"))[-1]
    seg.write_bytes(seg.read_bytes() + bytes(64))  # a torn tail: refused, not repaired
    code, out, err = run(capsys, "--from-log", str(log), "--config", CONFIG, *SET_ARGS)
    assert code == 1 and out == ""
    assert error_line(err) == f"pearl simulate: {verify(log)}"
