"""One borrow cycle of §4.6, as it really happened: what the controller reports, never what it
only planned.

A cycle is the training-idle window from Training Finished to the next Training Begin. In it the
gate (eq. 7) approves or declines borrowing; an approved borrow lends the training workers and
activates overlap workers, which then serve until Training Begin takes them back; the return
ends when the trainer hears "training may proceed". A borrow plan that is cancelled before it
commits is ``aborted`` (with the reason) and served nothing. Times are the controller's clock.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from pearl.core.schema import Value


class Verdict(enum.StrEnum):
    """The borrowing gate's verdict in a window (its value is what views and reports show)."""

    APPROVED = "approved"
    DECLINED = "declined"
    NONE = "none"  # never asked: nothing to lend

    @classmethod
    def of(cls, enabled: bool) -> Verdict:
        return cls.APPROVED if enabled else cls.DECLINED


class BorrowCycle(Value, frozen=True, kw_only=True):
    step: int  # the training step whose end opened the window
    opened: float  # Training Finished
    gate: Verdict = Verdict.NONE
    gate_reason: str = ""
    window_left_s: float | None = None  # the window's time left as the gate saw it (None: unknown)
    plan: int = 0  # the borrow plan (0: none began)
    planned: float | None = None  # when it began
    lent: int = 0  # training workers that released their GPUs
    activated: int = 0  # overlap workers that became routable
    serving_since: float | None = None  # when the borrow plan committed
    aborted: str = ""  # why the borrow plan was cancelled before it committed
    closed: float | None = None  # Training Begin
    returning: int = 0  # overlap workers holding training GPUs at Training Begin
    returned: float | None = None  # training may proceed

    @property
    def window_s(self) -> float | None:
        return None if self.closed is None else self.closed - self.opened

    @property
    def activation_s(self) -> float | None:
        if self.serving_since is None or self.planned is None:
            return None
        return self.serving_since - self.planned

    @property
    def served_s(self) -> float | None:
        if self.serving_since is None or self.closed is None:
            return None
        return max(0.0, self.closed - self.serving_since)

    @property
    def return_s(self) -> float | None:
        if self.returned is None or self.closed is None:
            return None
        return self.returned - self.closed

    def to_json(self) -> dict[str, Any]:
        """The cycle as the demo report and ``pearl status`` show it (seconds, null if n/a)."""
        return {
            "step": self.step,
            "window_s": self.window_s,
            "gate": self.gate,
            "gate_reason": self.gate_reason,
            "window_left_s": self.window_left_s,
            "plan": self.plan or None,
            "lent": self.lent,
            "activated": self.activated,
            "activation_s": self.activation_s,
            "served_s": self.served_s,
            "aborted": self.aborted or None,
            "returning": self.returning,
            "return_s": self.return_s,
        }


def gated(
    c: BorrowCycle | None, enabled: bool, reason: str, window_left_s: float | None = None
) -> BorrowCycle | None:
    """The gate's verdict in an open window (the latest one counts until a borrow begins);
    ``window_left_s``: the pipeline's ETA for the next batch it went by."""
    if c is None or c.closed is not None or c.plan:
        return c
    return msgspec.structs.replace(
        c, gate=Verdict.of(enabled), gate_reason=reason, window_left_s=window_left_s
    )


def planned(c: BorrowCycle | None, plan: int, now: float) -> BorrowCycle | None:
    if c is None or c.closed is not None or c.plan:
        return c
    return msgspec.structs.replace(c, plan=plan, planned=now, gate=Verdict.APPROVED)


def committed(
    c: BorrowCycle | None, plan: int, now: float, lent: int, activated: int
) -> BorrowCycle | None:
    if c is None or c.plan != plan:
        return c
    return msgspec.structs.replace(
        c, serving_since=now if activated else None, lent=lent, activated=activated
    )


def aborted(c: BorrowCycle | None, plan: int, reason: str) -> BorrowCycle | None:
    if c is None or c.plan != plan:
        return c
    return msgspec.structs.replace(c, aborted=reason)


def closed(c: BorrowCycle | None, now: float, returning: int) -> BorrowCycle | None:
    if c is None or c.closed is not None:
        return c
    return msgspec.structs.replace(c, closed=now, returning=returning)


def returned(c: BorrowCycle | None, now: float) -> BorrowCycle | None:
    if c is None or c.closed is None or c.returned is not None:
        return c
    return msgspec.structs.replace(c, returned=now)


__all__ = [
    "BorrowCycle",
    "Verdict",
    "aborted",
    "closed",
    "committed",
    "gated",
    "planned",
    "returned",
]
