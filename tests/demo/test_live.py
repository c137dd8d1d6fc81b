"""The demo's live line, rendered from a ``pearl status --json`` mapping: it says when vLLM (or
SGLang) servers are starting, how many, and for how long so far."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pearl import config
from pearl.core import events as ev
from pearl.core.controller import Controller
from pearl.core.fold import replay
from pearl.core.policy import Policy
from pearl.core.profile import prior_profile
from pearl.core.status import status_of, status_plain
from pearl.core.view import cluster_status, cluster_view
from pearl.demo.live import live_line, starting_workers

STATE = {"step": 0, "throughput": 0.0, "reward": 0.0}


@pytest.fixture(scope="module")
def first_status() -> dict[str, Any]:
    """The status of a fresh cluster right after pearld starts (the controller's first plans, as
    a client reads them): one dedicated worker starts in the background, a borrow lends the
    training worker's GPUs to two more."""
    cfg = config.load("configs/local-cpu.toml")
    c = cfg.cluster
    init = ev.ClusterInit(c.tp, c.training_gpus, c.reserved_gpus, c.preemptible_gpus)
    out = Controller(Policy(cfg.decision)).recover(replay([init]), prior_profile(cfg), 0.0)
    return status_plain(cluster_status(cluster_view(out.state)))


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
    m = copy.deepcopy(first_status)
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
    m = copy.deepcopy(first_status)
    for w in m["workers"]:
        w["activity"] = "active"
    m["plan"], m["transitions"] = None, []
    assert starting_workers(status_of(m)) == 0
    text = line(m, starting_s=5.0)
    assert "starting" not in text and text.endswith("+2 preemptible")
    assert "C1 (overlap 0)" in text  # the worker it started now serves
