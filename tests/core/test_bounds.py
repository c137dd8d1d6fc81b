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
    ev.GpusAdded((0, MAX_GPU_ID)),
    ev.GpusAdded(tuple(range(MAX_GPUS))),
    ev.GpusReclaiming((8,), 1.8e9),
    ev.GpusReclaimCancelled((8,)),
    ev.TrainingBegin(1),
    ev.TrainingBegin(MAX_STEP),
    ev.TrainingFinished(1),
    ev.TrainingFinished(MAX_STEP, 0),
    ev.TrainingFinished(2, MAX_VERSION),
    ev.WeightsPublished(0),
    ev.WeightsPublished(MAX_VERSION, "/w"),
    ev.WorkerRemoved(3),  # not an edge record: nothing to check
]

REFUSED: list[tuple[Any, str]] = [
    (ev.TrainingBegin(0), "training step 0 is out of range: training steps run from 1 to 2**63"),
    (ev.TrainingBegin(-1), "training step -1 is out of range"),
    (ev.TrainingBegin(2**64 - 1), "training step 18446744073709551615 is out of range"),
    (ev.TrainingBegin(MAX_STEP + 1), "is out of range"),
    (ev.TrainingFinished(0), "training step 0 is out of range"),
    (ev.TrainingFinished(3, -1), "weights version -1 is out of range: weights versions run from 0"),
    (ev.TrainingFinished(3, 2**64), "weights version 18446744073709551616 is out of range"),
    (ev.WeightsPublished(-5), "weights version -5 is out of range"),
    (ev.GpusAdded((1, MAX_GPU_ID + 1)), f"GPU id {MAX_GPU_ID + 1} is out of range: GPU ids are 0-"),
    (ev.GpusReclaimed((-1,)), "GPU id -1 is out of range"),
    (ev.GpusAdded(tuple(range(MAX_GPUS + 1))), f"{MAX_GPUS + 1} GPU ids, at most {MAX_GPUS}"),
    (ev.GpusReclaiming((8,), float("inf")), "deadline inf is out of range"),
    (ev.GpusReclaiming((8,), float("nan")), "deadline nan is out of range"),
    (ev.GpusReclaiming((8,), -1.0), "deadline -1.0 is out of range"),
    (ev.GpusReclaiming((8,), MAX_DEADLINE * 2), "is out of range: a Unix time in seconds"),
    (ev.TrainingBegin(True), "training step True is not an int"),
    (ev.GpusReclaimed(()), "no GPU id given: name at least one GPU"),
    (ev.GpusAdded(()), "no GPU id given"),
    (ev.GpusReclaimCancelled(()), "no GPU id given"),
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
        (ev.GpusAdded(()), "gpus"),
        (ev.GpusReclaiming((8,), -1.0), "deadline"),
        (ev.TrainingFinished(0), "step"),
        (ev.TrainingFinished(3, -1), "weights_version"),
        (ev.WeightsPublished(-5), "version"),
    ],
    ids=lambda x: str(x)[:40],
)
def test_the_fault_names_its_field(record: Any, field: str) -> None:
    fault = event_fault(record)
    assert fault is not None and fault[0] == field and fault[1] == event_problem(record)
