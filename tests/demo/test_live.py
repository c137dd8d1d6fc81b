"""The demo's live line, rendered from a ``pearl status --json`` mapping: it says when vLLM (or
SGLang) servers are starting, how many, and for how long so far."""

from __future__ import annotations

from typing import Any

import pytest

from pearl.core.status import status_of
from pearl.demo.live import live_line, starting_workers

STATE = {"step": 0, "throughput": 0.0, "reward": 0.0}


def worker(i: int, role: str, gpus: list[int], zone: str, activity: str) -> dict[str, Any]:
    return {
        "id": i,
        "gpus": gpus,
        "role": role,
        "activity": activity,
        "zone": zone,
        "incarnation": 1,
    }


def step(op: str, w: int, role: str | None = None, gpus: tuple[int, ...] = ()) -> dict[str, Any]:
    zone = "overlap" if op == "add" else None
    return {"op": op, "worker": w, "role": role, "gpus": list(gpus), "zone": zone}


@pytest.fixture
def first_status() -> dict[str, Any]:
    """``pearl status --json`` of a fresh local-cpu cluster right after pearld starts (as the
    controller's first plans leave it): worker 1 starts in the background on a dedicated GPU,
    and a borrow lends the training worker's GPUs to two more (its add steps wait for the lend).
    """
    return {
        "seq": 5,
        "workers": [
            worker(i=0, role="training", gpus=[0, 1], zone="overlap", activity="transitioning"),
            worker(i=1, role="colocated", gpus=[2], zone="dedicated", activity="transitioning"),
        ],
        "mode": "colocated",
        "N_P": 0,
        "N_D": 0,
        "N_C": 0,
        "tp": 1,
        "gpus": {"training": [0, 1], "reserved": [2], "present": [], "reclaiming": []},
        "phase": "idle",
        "training_step": 0,
        "weights_version": 0,
        "plan": {
            "plan": 2,
            "cause": "expand",
            "target": {"mode": "colocated", "N_P": 0, "N_D": 0, "N_C": 3},
            "steps": [
                step("lend", 0),
                step(op="add", w=2, role="colocated", gpus=(0,)),
                step(op="add", w=3, role="colocated", gpus=(1,)),
            ],
            "done": [],
        },
        "budget": {
            "dedicated_gpus": 1,
            "training_gpus": 2,
            "lent": False,
            "workers": 3,
            "stranded_gpus": [],
        },
        "transitions": [
            {"plan": 2, "cause": "expand", "target": "3C", "steps": 3, "done": 0, "aborting": None}
        ],
        "training_may_proceed": 0,
        "profile": None,
        "decision": None,
        "measured_makespan_s": None,
        "gate": None,
        "borrow": {"current": None, "last": None},
        "failed": [],
        "quarantined_gpus": [],
        "boot_id": "0123456789abcdef",
        "controller_recoveries": 0,
    }


def line(mapping: dict[str, Any], engine: str = "vllm", starting_s: float = 0.0) -> str:
    s = status_of(mapping)
    return live_line(
        s, t=42.0, state=STATE, event="+2 preemptible", engine=engine, starting_s=starting_s
    )


def test_the_line_says_how_many_vllm_servers_are_starting_and_for_how_long(
    first_status: dict[str, Any],
) -> None:
    rollout = [w for w in first_status["workers"] if w["role"] != "training"]
    assert [w["activity"] for w in rollout] == ["transitioning"]  # the trainer lends meanwhile
    text = line(first_status, starting_s=37.4)
    assert text.startswith("[  42.0s] step   0")
    assert text.endswith("starting 1 vLLM server: 37 s so far")
    assert "+2 preemptible" not in text  # what happens now, over the last event
    assert line(first_status, engine="sglang").endswith("starting 1 SGLang server: 0 s so far")
    assert line(first_status, engine="torch").endswith("starting 1 torch worker: 0 s so far")


def test_every_rollout_worker_coming_up_counts_and_nothing_else_does(
    first_status: dict[str, Any],
) -> None:
    m = first_status
    [trainer] = [w for w in m["workers"] if w["role"] == "training"]
    # The borrow's two workers are now starting too (the plan's add steps, not done).
    for step in m["plan"]["steps"]:
        if step["op"] == "add":
            m["workers"].append(
                {**trainer, "id": step["worker"], "role": "colocated", "gpus": step["gpus"]}
            )
    assert starting_workers(status_of(m)) == 3
    assert line(m, starting_s=130.0).endswith("starting 3 vLLM servers: 130 s so far")
    # A role change or a drain also transitions, but starts no server.
    m["plan"]["steps"].append(
        {"op": "set_role", "worker": 2, "role": "decode", "gpus": [], "zone": None}
    )
    assert starting_workers(status_of(m)) == 2
    m["plan"]["done"] = [len(m["plan"]["steps"]) - 1]  # done: it starts nothing any more
    assert starting_workers(status_of(m)) == 3


def test_once_the_servers_serve_the_line_shows_the_last_event_again(
    first_status: dict[str, Any],
) -> None:
    m = first_status
    for w in m["workers"]:
        w["activity"] = "active"
    m["plan"], m["transitions"] = None, []
    assert starting_workers(status_of(m)) == 0
    text = line(m, starting_s=5.0)
    assert "starting" not in text and text.endswith("+2 preemptible")
    assert "C1 (overlap 0)" in text  # the worker it started now serves
