"""pearl.core.bounds: the numbers PEARL takes from outside are in range, or refused in one line
that says the range (issue 35: a step of 2**64 - 1 bricked the state dir; step 0 was accepted)."""

from __future__ import annotations

from typing import Any

import pytest

from pearl.core import events as ev
from pearl.core.bounds import (
    MAX_DEADLINE,
    MAX_GPU_ID,
    MAX_GPUS,
    MAX_STEP,
    MAX_VERSION,
    check_event,
    event_fault,
    event_problem,
)
from pearl.core.errors import SchemaError

FINE = [
    ev.GpusAdded(gpus=(0, MAX_GPU_ID)),
    ev.GpusAdded(gpus=tuple(range(MAX_GPUS))),
    ev.GpusReclaiming(gpus=(8,), deadline=1.8e9),
    ev.GpusReclaimCancelled(gpus=(8,)),
    ev.TrainingBegin(step=1),
    ev.TrainingBegin(step=MAX_STEP),
    ev.TrainingFinished(step=1),
    ev.TrainingFinished(step=MAX_STEP, weights_version=0),
    ev.TrainingFinished(step=2, weights_version=MAX_VERSION),
    ev.WeightsPublished(version=0),
    ev.WeightsPublished(version=MAX_VERSION, uri="/w"),
    ev.WorkerRemoved(worker=3),  # not an edge record: nothing to check
]

REFUSED: list[tuple[Any, str]] = [
    (
        ev.TrainingBegin(step=0),
        "training step 0 is out of range: training steps run from 1 to 2**63",
    ),
    (ev.TrainingBegin(step=-1), "training step -1 is out of range"),
    (ev.TrainingBegin(step=2**64 - 1), "training step 18446744073709551615 is out of range"),
    (ev.TrainingBegin(step=MAX_STEP + 1), "is out of range"),
    (ev.TrainingFinished(step=0), "training step 0 is out of range"),
    (
        ev.TrainingFinished(step=3, weights_version=-1),
        "weights version -1 is out of range: weights versions run from 0",
    ),
    (
        ev.TrainingFinished(step=3, weights_version=2**64),
        "weights version 18446744073709551616 is out of range",
    ),
    (ev.WeightsPublished(version=-5), "weights version -5 is out of range"),
    (
        ev.GpusAdded(gpus=(1, MAX_GPU_ID + 1)),
        f"GPU id {MAX_GPU_ID + 1} is out of range: GPU ids are 0-",
    ),
    (ev.GpusReclaimed(gpus=(-1,)), "GPU id -1 is out of range"),
    (ev.GpusAdded(gpus=tuple(range(MAX_GPUS + 1))), f"{MAX_GPUS + 1} GPU ids, at most {MAX_GPUS}"),
    (ev.GpusReclaiming(gpus=(8,), deadline=float("inf")), "deadline inf is out of range"),
    (ev.GpusReclaiming(gpus=(8,), deadline=float("nan")), "deadline nan is out of range"),
    (ev.GpusReclaiming(gpus=(8,), deadline=-1.0), "deadline -1.0 is out of range"),
    (
        ev.GpusReclaiming(gpus=(8,), deadline=MAX_DEADLINE * 2),
        "is out of range: a Unix time in seconds",
    ),
    (ev.TrainingBegin(step=True), "training step True is not an int"),
    (ev.GpusReclaimed(gpus=()), "no GPU id given: name at least one GPU"),
    (ev.GpusAdded(gpus=()), "no GPU id given"),
    (ev.GpusReclaimCancelled(gpus=()), "no GPU id given"),
]


@pytest.mark.parametrize("record", FINE, ids=lambda r: type(r).__name__)
def test_records_within_bounds_pass(record: Any) -> None:
    assert event_problem(record) is None
    check_event(record)


@pytest.mark.parametrize(("record", "words"), REFUSED, ids=lambda x: str(x)[:40])
def test_a_number_out_of_bounds_is_one_line_with_the_range(record: Any, words: str) -> None:
    with pytest.raises(SchemaError) as e:
        check_event(record)
    msg = str(e.value)
    assert words in msg and msg.endswith("nothing was logged") and "\n" not in msg, msg


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (ev.GpusAdded(gpus=()), "gpus"),
        (ev.GpusReclaiming(gpus=(8,), deadline=-1.0), "deadline"),
        (ev.TrainingFinished(step=0), "step"),
        (ev.TrainingFinished(step=3, weights_version=-1), "weights_version"),
        (ev.WeightsPublished(version=-5), "version"),
    ],
    ids=lambda x: str(x)[:40],
)
def test_the_fault_names_its_field(record: Any, field: str) -> None:
    fault = event_fault(record)
    assert fault is not None and fault[0] == field and fault[1] == event_problem(record)
