"""Liveness with a fake clock: dead after 3 missed intervals, any message counts."""

from __future__ import annotations

import pytest

from transports.heartbeat import HeartbeatSender, Liveness


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_dead_after_three_missed_intervals() -> None:
    clock = FakeClock()
    live = Liveness(interval_s=0.5, clock=clock)
    live.beat("w1")
    clock.t += 1.49
    assert live.alive("w1") and live.dead() == []
    clock.t += 0.01  # 3 x 0.5 s of silence
    assert not live.alive("w1")
    assert live.dead() == ["w1"]
    assert live.dead() == ["w1"]  # dead() reports, reap() forgets
    assert live.reap() == ["w1"]
    assert live.reap() == [] and live.peers() == []


def test_any_beat_resets_the_timer_and_peers_are_independent() -> None:
    clock = FakeClock()
    live = Liveness(interval_s=1.0, liveness=3, clock=clock)
    live.beat("a")
    live.beat("b")
    for _ in range(10):
        clock.t += 2.0
        live.beat("a")
    assert live.alive("a") and not live.alive("b")
    assert live.dead() == ["b"]
    assert live.next_deadline() == live.last_seen("b") + 3.0  # type: ignore[operator]


def test_unknown_peer_is_not_alive_and_explicit_now_wins() -> None:
    live = Liveness(interval_s=1.0, clock=FakeClock())
    assert not live.alive("ghost") and live.next_deadline() is None
    live.beat("p", now=5.0)
    assert live.alive("p", now=7.9) and not live.alive("p", now=8.0)
    live.forget("p")
    assert live.peers() == []


def test_liveness_is_configurable_and_validated() -> None:
    clock = FakeClock()
    live = Liveness(interval_s=1.0, liveness=5, clock=clock)
    live.beat("p")
    clock.t += 4.5
    assert live.alive("p") and live.timeout_s == 5.0
    with pytest.raises(ValueError):
        Liveness(interval_s=0)
    with pytest.raises(ValueError):
        Liveness(liveness=0)


def test_sender_sends_when_due_and_any_send_counts() -> None:
    clock = FakeClock()
    sender = HeartbeatSender(interval_s=1.0, clock=clock)
    sent: list[float] = []
    assert sender.tick(lambda: sent.append(clock.t))  # nothing sent yet: due at once
    clock.t += 0.6
    assert not sender.tick(lambda: sent.append(clock.t))
    assert sender.time_left() == pytest.approx(0.4)
    sender.sent()  # a request went out: that is a heartbeat too
    clock.t += 0.9
    assert not sender.due()
    clock.t += 0.1
    assert sender.tick(lambda: sent.append(clock.t))
    assert sent == [1000.0, 1001.6]


def test_default_clock_is_monotonic() -> None:
    import time

    assert Liveness().clock is time.monotonic
    assert HeartbeatSender().clock is time.monotonic


def test_silence_is_judged_only_up_to_when_the_receiver_fell_behind() -> None:
    clock = FakeClock()
    live = Liveness(interval_s=0.5, clock=clock)
    live.beat("w1")
    clock.t += 1.0
    live.behind()  # input waits unread from here on (a slow handler, a starved thread)
    clock.t += 5.0
    assert live.alive("w1") and live.dead() == [] and live.reap() == []
    live.behind()  # a later call does not move the mark
    live.caught_up()  # read everything: w1 sent nothing in all that time
    assert live.dead() == ["w1"]
    live.beat("w2")
    live.behind()
    live.beat("w2")  # beats recorded while behind count as usual
    clock.t += 2.0
    assert live.dead() == ["w1"]


def test_a_starved_receiver_freezes_the_judging_clock_too() -> None:
    """A receiver thread that never gets the CPU cannot say it is behind; what it last said,
    that it had nothing to read, holds only for ``idle_grace_s``."""
    clock = FakeClock()
    live = Liveness(interval_s=0.5, clock=clock, idle_grace_s=0.1)
    live.beat("w1")
    live.caught_up()  # the poll loop ran and found nothing
    clock.t += 5.0  # ... then was starved: beats may wait unread
    assert live.alive("w1") and live.dead() == []
    live.caught_up()  # it ran again and read everything: w1 really was silent
    assert live.dead() == ["w1"]
