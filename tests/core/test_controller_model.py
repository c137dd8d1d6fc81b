"""The controller model (pearl/testing/controller_model.py) in make test: ``MODEL_EXAMPLES`` x
``MODEL_STEPS`` steps (>= 10,000), and the sequences it found, kept as named regressions."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from pearl.testing.controller_model import STEPS_RUN, ControllerModel

MODEL_EXAMPLES = int(os.environ.get("PEARL_MODEL_EXAMPLES", "150"))
MODEL_STEPS = int(os.environ.get("PEARL_MODEL_STEPS", "100"))

ControllerModel.TestCase.settings = settings(
    max_examples=MODEL_EXAMPLES,
    stateful_step_count=MODEL_STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestControllerModel = ControllerModel.TestCase


def test_the_model_ran_at_least_ten_thousand_steps() -> None:
    """Runs after the machine (file order): make test really takes >= 10,000 steps."""
    if not STEPS_RUN[0]:
        pytest.skip("the state machine did not run in this session (selected alone)")
    if MODEL_EXAMPLES * MODEL_STEPS >= 10_000:
        assert STEPS_RUN[0] >= 10_000, STEPS_RUN[0]


# -- sequences the model found, kept as named regressions ------------------------------------


def test_a_lost_worker_s_slot_reused_by_a_borrowed_worker_is_not_evicted() -> None:
    """Found by the model on the old controller: a reserved worker was given up on (lost) and
    removed, but stayed in ``lost``; the overlap worker that reused its slot at the next borrow
    was evicted by that stale claim, re-activated, evicted again (plan after plan), and a reclaim
    then crashed the controller with 'no worker in slot 3'."""
    m = ControllerModel()
    m.rollout_progress(remaining=0)
    m.training_begin()
    m.executors_catch_up(slow_stops=False)
    m.gpus_added(start=0, n=4)
    m.executors_catch_up(slow_stops=False)
    m.worker_lost(i=0)
    m.executors_catch_up(slow_stops=False)
    m.weights_published()
    m.training_finished(publish=False)
    plans = m.table.last_plan
    m.executors_catch_up(slow_stops=False)
    assert not m.s.lost and m.table.last_plan - plans <= 2  # one borrow plan, no flapping
    m.weights_published()
    m.gpus_reclaimed(start=0, n=1)
    m.executors_catch_up(slow_stops=False)
    m.bookkeeping_names_only_workers_in_the_table()
    m.table_is_the_fold_of_the_log()
