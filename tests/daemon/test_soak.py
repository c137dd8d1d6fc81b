"""Kill -9 soak: SIGKILL a real pearld at random moments during expansions, reclaims and borrow
cycles. After every restart each acknowledged event is in the log, the table is valid (no GPU
bound twice), and borrowed GPUs come back before training proceeds."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from pearl.core import events as ev
from pearl.core.state import validate
from tests.daemon.conftest import Pearld, wait_until
from transports.rpc import RemoteError, RequestTimeout

pytestmark = pytest.mark.slow

ROUNDS = 30  # kills at least
# Kills must land inside transitions (a plan in flight) often enough to test recovery from them.
# Where they land depends on timing: 11-15 of 30 here on an idle VM, 2 of 30 in one fresh-clone
# run. So the soak goes on, up to MAX_ROUNDS, until IN_TRANSITION of them have.
MAX_ROUNDS = 90
IN_TRANSITION = 5
PREEMPTIBLE = list(range(8, 16))


def next_event(rng: random.Random, s: dict[str, Any]) -> Any:
    present = set(s["gpus"]["present"]) | set(s["gpus"]["reclaiming"])
    absent = [g for g in PREEMPTIBLE if g not in present]
    options: list[Any] = []
    if len(absent) >= 2:
        pair = rng.sample(absent, 2)
        options.append(ev.GpusAdded(gpus=tuple(sorted(pair))))
    if s["gpus"]["present"]:
        options.append(ev.GpusReclaimed(gpus=(rng.choice(s["gpus"]["present"]),)))
    if s["phase"] == "idle":
        options.append(ev.TrainingBegin(step=s["training_step"] + 1))
    elif s["training_may_proceed"] >= s["training_step"]:
        options.append(
            ev.TrainingFinished(step=s["training_step"], weights_version=s["weights_version"] + 1)
        )
    return rng.choice(options)


def returned_before_training(d: Pearld) -> None:
    """If a training step is pending, pearld must get every borrowed GPU back and say so."""
    s = d.status()
    if s["phase"] == "training":
        try:
            wait_until(
                lambda: (x := d.status())["training_may_proceed"] >= x["training_step"],
                30,
                "borrowed GPUs to be returned after a restart",
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\nstatus: {d.status()}\npearld: {d.log_tail()}") from None
        s = d.status()
        trainer = [w for w in s["workers"] if w["role"] == "training"]
        assert all(w["activity"] == "active" for w in trainer)
        assert not any(
            w["zone"] == "overlap" and w["role"] != "training" and w["activity"] != "inactive"
            for w in s["workers"]
        )


def test_kill_minus_nine_soak(pearld_factory: Any) -> None:
    rng = random.Random(2026)
    d: Pearld = pearld_factory("daemon.borrow=always", start=False)
    acked: dict[int, Any] = {}
    kills = in_flight = 0
    while kills < ROUNDS or (in_flight < IN_TRANSITION and kills < MAX_ROUNDS):
        d.start()
        returned_before_training(d)
        for _ in range(rng.randint(1, 3)):
            try:
                rec = next_event(rng, d.status())
                acked[d.event(rec)] = rec
            except RemoteError:
                pass  # refused against the logged state (e.g. GPUs still being returned)
            time.sleep(rng.uniform(0.0, 0.15))  # random spacing is the point: no event to wait
        time.sleep(rng.uniform(0.0, 0.1))  # random: land the kill anywhere in the transitions
        d.kill9()
        kills += 1

        table = d.replayed()
        in_flight += table.plan is not None
        validate(table)  # no GPU bound twice, overlap workers only on lent GPUs, ...
        logged = dict(d.records())
        for seq, rec in acked.items():
            assert logged.get(seq) == rec, f"acknowledged {rec} at seq {seq} is not in the log"

    d.start()
    returned_before_training(d)
    s = d.settled(60)
    print(f"{in_flight} of {kills} kills landed during a transition")
    assert in_flight >= IN_TRANSITION, f"only {in_flight} of {kills} kills landed in a transition"
    validate(d.replayed())
    table = d.replayed(s["seq"]).to_json()
    assert (table["seq"], table["workers"]) == (s["seq"], s["workers"])
    # Every worker the table says is active runs in a host pearld adopted or relaunched.
    hosts = {name.split("-")[1] for name in d.host_pids()}
    for w in s["workers"]:
        if w["role"] != "training" and w["activity"] == "active":
            assert str(w["id"]) in hosts
    try:
        d.status()
    except RequestTimeout:  # pragma: no cover
        pytest.fail("pearld stopped answering after the soak")
