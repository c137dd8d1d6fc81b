"""A borrow cycle's gate verdict is an enum whose values are the words views always carried."""

from __future__ import annotations

import msgspec
import pytest

from pearl.core import borrow as bc
from pearl.core.borrow import BorrowCycle, Verdict


@pytest.mark.parametrize("word", ["approved", "declined", "none"])
def test_a_view_with_the_gate_as_a_string_decodes_to_the_verdict(word: str) -> None:
    raw = msgspec.json.encode({"step": 3, "opened": 1.5, "gate": word})
    cycle = msgspec.json.decode(raw, type=BorrowCycle)
    assert cycle.gate is Verdict(word)
    assert msgspec.json.encode(cycle).count(f'"gate":"{word}"'.encode()) == 1


def test_an_unknown_verdict_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"step": 3, "opened": 1.5, "gate": "maybe"}', type=BorrowCycle)


def test_the_gate_records_its_verdict_until_a_borrow_begins() -> None:
    c = BorrowCycle(step=1, opened=0.0)
    assert c.gate is Verdict.NONE and c.to_json()["gate"] == "none"
    declined = bc.gated(c, False, "benefit 0 s <= T_toggle 1 s")
    assert declined is not None and declined.gate is Verdict.DECLINED
    began = bc.planned(declined, plan=4, now=2.0)
    assert began is not None and began.gate is Verdict.APPROVED
    assert bc.gated(began, False, "too late") == began  # a borrow began: the verdict stands
