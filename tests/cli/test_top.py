"""``pearl top``: the frame from a canned status (pure), and against a real in-process pearld."""

from __future__ import annotations

import io
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pearl import config as config_mod
from pearl.cli import main, top
from pearl.cli.top import describe, render
from pearl.core.status import ClusterStatus
from pearl.daemon import Daemon
from tests.daemon.conftest import CONFIG, SMALL, wait_until
from transports.protocol import StatusRequest
from transports.rpc import Client

NOW = 1_767_225_600.0  # any fixed clock


def worker(i: int, role: str, gpus: list[int], zone: str, act: str = "active") -> dict[str, Any]:
    return {
        "id": i,
        "gpus": gpus,
        "role": role,
        "activity": act,
        "zone": zone,
        "incarnation": i + 1,
    }


# A `pearl status --json` object of a disaggregated 3P:4D pool, in the shape a real pearld sends.
STATUS: dict[str, Any] = {
    "seq": 42,
    "workers": [
        worker(i=0, role="training", gpus=[0, 1, 2, 3], zone="overlap", act="inactive"),
        worker(i=1, role="prefill", gpus=[0, 1], zone="overlap"),
        worker(i=2, role="decode", gpus=[2, 3], zone="overlap"),
        worker(i=3, role="prefill", gpus=[4, 5], zone="dedicated"),
        worker(i=4, role="prefill", gpus=[6, 7], zone="dedicated"),
        worker(i=5, role="decode", gpus=[8, 9], zone="dedicated"),
        worker(i=6, role="decode", gpus=[10, 11], zone="dedicated"),
        worker(i=7, role="decode", gpus=[12, 13], zone="dedicated", act="transitioning"),
    ],
    "mode": "disaggregated",
    "N_P": 3,
    "N_D": 4,
    "N_C": 0,
    "tp": 2,
    "gpus": {
        "training": [0, 1, 2, 3],
        "reserved": [4, 5, 6, 7],
        "present": [8, 9, 10, 11, 12, 13],
        "reclaiming": [],
    },  # fmt: skip
    "phase": "idle",
    "training_step": 3,
    "weights_version": 3,
    "plan": None,
    "budget": {"dedicated_gpus": 10, "training_gpus": 4, "lent": True},
    "transitions": [
        {"plan": 9, "cause": "expand", "target": "3P4D", "steps": 2, "done": 1, "aborting": None}
    ],
    "training_may_proceed": 3,
    "profile": {
        "B": 64,
        "S": 15.0,
        "delta_L": 2000.0,
        "r": 150.0,
        "theta": 0.5,
        "A": 0.003940030376119403,
        "b": 0.00048512560295027796,
        "t_prefill": 2.6281983586011725e-05,
        "T_env": 0.0,
        "T_start": 60.0,  # 33.5 s of colocated work on 7 workers + 60 s: 93.5 s
        "T_over": 0.5,
        "K": 147456.0,
        "K_seq": 4755456000.0,
        "H_max": 127618529280.0,
        "BW": 80000000000.0,
        "T_toggle": 9.44,
        "T_window": 31.5,
        "B_flight": None,
        "delta_P": None,
        "observed": 3,
    },  # fmt: skip
    "decision": {
        "target": "3P4D",
        "predicted_makespan_s": 88.25,
        "reason": "budget 6 -> 7: switched to disaggregated mode as 3P4D (switch gain 12.1%)",
    },
    "measured_makespan_s": 92.0,
    "gate": {
        "enabled": True,
        "benefit_s": 30.08,
        "T_ded": 136.52,
        "T_full": 106.44,
        "T_toggle": 9.44,
        "T_window": 31.5,
        "reason": "benefit 30.1 s > T_toggle 9.44 s (eq. 7)",
    },  # fmt: skip
    "borrow": {
        "current": {
            "step": 3,
            "window_s": None,
            "gate": "approved",
            "gate_reason": "...",
            "plan": 8,
            "lent": 2,
            "activated": 2,
            "activation_s": 0.61,
            "served_s": None,
            "aborted": None,
            "returning": 0,
            "return_s": None,
        },
        "last": {
            "step": 2,
            "window_s": 31.5,
            "gate": "approved",
            "gate_reason": "...",
            "plan": 6,
            "lent": 2,
            "activated": 2,
            "activation_s": 0.58,
            "served_s": 30.2,
            "aborted": None,
            "returning": 0,
            "return_s": 0.412,
        },
    },  # fmt: skip
    "failed": [],
    "quarantined_gpus": [],
    "boot_id": "6e3da72faad63407",
    "controller_recoveries": 0,
    "endpoint": "tcp://10.0.0.7:7440",
    "pub_endpoint": "tcp://10.0.0.7:7441",
}
EVENTS = [
    {"time": NOW - 5, "seq": 40, "text": "gpus added 12-13"},
    {"time": NOW - 4, "seq": 41, "text": "plan 9 expand -> 3P4D begun (0/2 steps)"},
]


def test_render_shows_the_pool_the_decision_the_gate_and_the_events() -> None:
    frame = render(STATUS, EVENTS, NOW)
    lines = frame.splitlines()
    assert all(len(line) <= 100 for line in lines)
    assert "\x1b" not in frame
    assert lines[0].startswith("pearld tcp://10.0.0.7:7440  seq 42  training idle (step 3)")
    assert "weights v3" in lines[0] and time.strftime("%H:%M:%S", time.localtime(NOW)) in lines[0]
    assert "mode disaggregated 3P:4D  routable 6/7" in frame
    assert "budget 10 dedicated + 4 training GPUs (lent)" in frame
    # predicted (88.2 s) vs colocation on the same 7 workers (eq. 1), and measured with the error
    decision = next(line for line in lines if line.startswith("decision "))
    m = re.search(r"predicted 88\.2s vs colocated (\d+\.\d)s", decision)
    assert m and float(m.group(1)) > 88.25, decision
    assert "last measured 92.0s (error -4.1%)" in decision
    assert "switched to disaggregated mode" in frame
    assert "gate approved: benefit 30.1s vs T_toggle 9.44s  T_ded 136.5s  T_full 106.4s" in frame
    assert "borrow now : step 3 approved  window -  lent 2 activated 2 (0.61s)" in frame
    assert "borrow last: step 2 approved  window 31.5s" in frame
    assert "served 30.2s  return 0.41s" in frame
    assert "plan 9 expand -> 3P4D: 1/2 steps, in flight" in frame
    # workers grouped by role, with counts, in role order
    assert "workers 8: prefill 3  decode 4  training 1" in frame
    groups = [
        line.split()[0] for line in lines if re.match(r"  (prefill|decode|training) \(", line)
    ]
    assert groups == ["prefill", "decode", "training"]
    assert re.search(r"prefill \(3\)\s+1\s+active\s+overlap\s+0-1\s+2$", frame, re.M)
    assert re.search(r"^\s+7\s+transitioning\s+dedicated\s+12-13\s+8$", frame, re.M)
    assert re.search(r"training \(1\)\s+0\s+inactive\s+overlap\s+0-3\s+1$", frame, re.M)
    # the last changes, oldest first
    tail = lines[lines.index("last changes (2)") :]
    assert "seq 40" in tail[1] and "gpus added 12-13" in tail[1]
    assert "plan 9 expand -> 3P4D begun" in tail[2]


def test_on_a_short_terminal_the_worker_table_shrinks_to_fit() -> None:
    lines = render(STATUS, EVENTS, NOW, height=24).splitlines()
    assert len(lines) == 24
    assert "workers 8: prefill 3  decode 4  training 1" in lines  # the counts stay whole
    assert sum("... 1 more prefill workers" in line for line in lines) == 1
    assert sum("... 2 more decode workers" in line for line in lines) == 1
    assert lines[-1].endswith("plan 9 expand -> 3P4D begun (0/2 steps)")  # events kept
    assert len(render(STATUS, EVENTS, NOW, height=100).splitlines()) < 100  # room: every row


def test_render_survives_an_older_pearld_that_sends_almost_nothing() -> None:
    sparse = {"seq": 3, "workers": [{"id": 1}], "decision": {}, "gate": {},
              "borrow": {"current": {}}, "transitions": [{}], "mode": "x"}  # fmt: skip
    for status in ({}, {"seq": 3}, sparse):
        frame = render(status, [{"text": "something"}, {}], NOW, width=80)
        assert all(len(line) <= 80 for line in frame.splitlines())
        assert "decision -" in frame or "decision -: predicted -" in frame
        assert "last measured -" in frame or "decision -" in frame
    assert "workers -" in render({}, [], NOW)
    assert "(none since top started)" in render({}, [], NOW)
    frame = render({"profile": {"B": "garbage"}, "decision": {"target": "4C"}}, [], NOW)
    assert "vs colocated -" in frame  # a profile it cannot read is not a crash


def test_render_says_when_pearld_stopped_answering_and_why_there_are_no_events() -> None:
    frame = render(STATUS, [], NOW, note="change stream unavailable (x); showing status only",
                   down_since=NOW - 30)  # fmt: skip
    since = time.strftime("%H:%M:%S", time.localtime(NOW - 30))
    assert f"pearld not answering since {since}" in frame
    assert "change stream unavailable (x); showing status only" in frame
    assert "(none since top started)" not in frame


def test_describe_names_what_changed() -> None:
    before = {**STATUS, "gpus": {**STATUS["gpus"], "present": [8, 9, 10, 11]}, "transitions": []}
    before["workers"] = STATUS["workers"][:-1]
    done = worker(i=7, role="decode", gpus=[12, 13], zone="dedicated", act="active")
    after = {**STATUS, "workers": [*STATUS["workers"][:-1], done]}
    after["transitions"] = []
    assert describe(None, STATUS) == []
    changes = describe(before, STATUS)
    assert "gpus added 12-13" in changes
    assert "plan 9 expand -> 3P4D begun (1/2 steps)" in changes
    assert "added worker 7 decode on 12-13" in changes
    changes = describe(STATUS, after)
    assert "plan 9 expand -> 3P4D finished" in changes and "workers 7 now active" in changes
    assert describe(STATUS, {**STATUS, "phase": "training", "training_step": 4}) == [
        "training training (step 4)"
    ]


# -- against a real pearld (in process, sim engines) --------------------------------------------


@pytest.fixture
def pearld(tmp_path: Path) -> Iterator[Daemon]:
    """A pearld whose socket path is short, so the frame's header (100 columns off a terminal)
    holds the whole address wherever the test's temporary directory is."""
    cfg = config_mod.load(CONFIG, ["daemon.borrow=never", *SMALL])
    sock = Path(tempfile.mkdtemp(prefix="top-", dir="/tmp"))
    d = Daemon(cfg, tmp_path / "state", f"ipc://{sock}/api.sock")
    d.start()
    try:
        c = Client(d.address, timeout_s=2.0)
        try:  # settled: the start-up plans are done, every rollout worker serves
            wait_until(lambda: settled(c.request(StatusRequest()).payload), 30, "pearld to settle")
        finally:
            c.close()
        yield d
    finally:
        d.stop()
        shutil.rmtree(sock, ignore_errors=True)


def settled(s: ClusterStatus | None) -> bool:
    if s is None:
        return False
    rollout = [w for w in s.workers if w.role != "training"]
    return bool(rollout) and not s.transitions and all(w.activity == "active" for w in rollout)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def after_first_frame(
    monkeypatch: pytest.MonkeyPatch, action: Callable[[], object]
) -> list[Callable[[], object]]:
    """Run ``action`` once, between ``top``'s first and second frames."""
    todo = [action]
    real = top._sleep_until

    def sleep(deadline: float, tick: Callable[[], None]) -> None:
        while todo:
            todo.pop()()
        real(deadline, tick)

    monkeypatch.setattr(top, "_sleep_until", sleep)
    return todo


def test_once_prints_the_workers(pearld: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--endpoint", pearld.address, "top", "--once")
    assert code == 0 and err == "", err
    assert "\x1b" not in out
    assert out.startswith(f"pearld {pearld.address}  seq ")
    assert "mode colocated 2C" in out
    assert "workers 3: colocated 2  training 1" in out
    assert re.search(r"colocated \(2\)\s+1\s+\w+\s+dedicated\s+4-5", out)
    assert re.search(r"training \(1\)\s+0\s+\w+\s+overlap\s+0-3", out)
    assert out.count("pearld ") == 1  # one frame


def test_a_later_frame_shows_an_event(
    pearld: Daemon, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ep = pearld.address
    after_first_frame(monkeypatch, lambda: main(["--endpoint", ep, "event", "gpus-added",
                                                 "--gpus", "8-11"]))  # fmt: skip
    code, out, err = run(capsys, "--endpoint", ep, "top", "--count", "3", "--interval", "0.4")
    assert code == 0 and err == "", err
    frames = out.split("\npearld ")
    assert len(frames) == 3 and "\x1b" not in out  # not a terminal: plain frames in a row
    assert "(none since top started)" in frames[0]
    last = frames[-1]
    events = last[last.index("last changes (") :]
    assert re.search(r"seq \d+\s+gpus added 8-11", events), last


def test_top_shows_when_pearld_goes_away(
    pearld: Daemon, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    after_first_frame(monkeypatch, pearld.stop)
    code, out, err = run(capsys, "--endpoint", pearld.address, "top", "--count", "2",
                         "--interval", "0.2", "--timeout", "0.3")  # fmt: skip
    assert code == 0, err
    first, second = out.split("\npearld ")
    assert "not answering" not in first
    assert re.search(r"pearld not answering since \d\d:\d\d:\d\d", second)
    assert "workers 3: colocated 2  training 1" in second  # the last status it had


def test_on_a_terminal_it_redraws_and_ctrl_c_leaves_it_sane(
    pearld: Daemon, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Tty()
    monkeypatch.setattr("sys.stdout", screen)

    def interrupt() -> None:
        raise KeyboardInterrupt

    after_first_frame(monkeypatch, interrupt)
    assert main(["--endpoint", pearld.address, "top", "--interval", "0.1"]) == 0
    text = screen.getvalue()
    assert text.startswith(top.HIDE + top.CLEAR + top.HOME + "pearld ")
    assert text.endswith(top.SHOW + "\n")  # the cursor is back
    assert f"workers 3: colocated 2  training 1{top.EOL}\n" in text
    assert capsys.readouterr().err == ""


def test_an_unreachable_pearld_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys, "--endpoint", f"ipc://{tmp_path}/nothing.sock", "top", "--timeout", "0.2"
    )
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("pearl top: ") and "unreachable" in err, err
