"""The gateway's sessions as trajectories: turns, tokens, environment time, rollout steps."""

from __future__ import annotations

from pearl.gateway.sessions import SessionBook


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_session_is_one_trajectory_with_its_turns_tokens_and_environment_time() -> None:
    clock = Clock()
    book = SessionBook(per_step=1, idle_s=30.0, clock=clock)
    key = book.begin("s", 10)
    book.attempt(key, 3, 4, 10, 0, decode_steps=4, decode_batch_sum=8)
    clock.t += 2.0
    book.end(key, 10, 4)
    clock.t += 5.0  # the environment (the agent's tools) ran for 5 s
    assert book.begin("s", 20) == key  # the prompt grew by 6 tokens beyond the context (14)
    book.attempt(key, 3, 2, 20, 14)
    clock.t += 1.0
    book.end(key, 20, 2)
    assert book.take_step() is None  # still open: its next turn may come
    clock.t += 30.0
    step = book.take_step()  # idle for idle_s: it ended
    assert step is not None and step.step == 1 and len(step.trajectories) == 1
    t = step.trajectories[0]
    assert (t.turns, t.new_tokens, t.generated_tokens, t.env_s) == (2, 16, 6, 5.0)
    assert t.prefilled_tokens == 10 + 6 and t.seen_batch == 2.0 and t.latency_s == 8.0
    assert step.makespan_s == 8.0 and step.in_flight == 1.0
    assert list(book.recent)[0].workers == [3, 3]


def test_steps_come_every_n_ended_sessions_and_at_a_boundary() -> None:
    clock = Clock()
    book = SessionBook(per_step=2, idle_s=1000.0, clock=clock)
    for _ in range(3):  # requests without a session: one-turn trajectories, ended at once
        key = book.begin("", 5)
        book.end(key, 5, 1)
    step = book.take_step()
    assert step is not None and len(step.trajectories) == 2
    assert book.take_step() is None  # one ended, fewer than per_step
    running = book.begin("busy", 5)  # in flight at the boundary: it stays open
    idle = book.begin("idle", 5)
    book.end(idle, 5, 1)
    book.boundary()
    step = book.take_step()
    assert step is not None and step.step == 2 and len(step.trajectories) == 2
    assert set(book.open) == {running}
    assert book.take_step() is None
