"""The gateway's sessions as trajectories: turns, tokens, environment time, rollout steps."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pearl.gateway.sessions import MAX_SESSION_BYTES, RECENT, SessionBook, session_problem
from tests.gateway.scripted import ScriptedBackend


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_session_is_one_trajectory_with_its_turns_tokens_and_environment_time() -> None:
    clock = Clock()
    book = SessionBook(per_step=1, idle_s=30.0, clock=clock)
    key = book.begin("s", 10)
    book.attempt(
        key=key,
        worker=3,
        generated=4,
        prompt_tokens=10,
        cached_tokens=0,
        decode_steps=4,
        decode_batch_sum=8,
    )
    clock.t += 2.0
    book.end(key, 10, 4)
    clock.t += 5.0  # the environment (the agent's tools) ran for 5 s
    assert book.begin("s", 20) == key  # the prompt grew by 6 tokens beyond the context (14)
    book.attempt(key=key, worker=3, generated=2, prompt_tokens=20, cached_tokens=14)
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


class ScanBook:
    """The reference: which sessions are open, by a scan of them all (the rule, not the cost)."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.open: dict[str, list[float | int | None]] = {}  # key -> [running, last_end]
        self.ended: list[str] = []

    def begin(self, key: str, now: float) -> None:
        self.expire(now)
        self.open.setdefault(key, [0, None])[0] += 1  # type: ignore[operator]

    def end(self, key: str, now: float) -> None:
        s = self.open[key]
        s[0], s[1] = max(0, s[0] - 1), now  # type: ignore[operator]

    def expire(self, now: float) -> None:
        for key, (running, last) in list(self.open.items()):
            if not running and last is not None and now - last >= self.idle_s:
                del self.open[key]
                self.ended.append(key)

    def boundary(self) -> None:
        for key in [k for k, (running, _) in self.open.items() if not running]:
            del self.open[key]
            self.ended.append(key)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["begin", "end", "wait", "boundary", "step"]),
            st.sampled_from(["a", "b", "c"]),
            st.floats(0.0, 40.0),
        ),
        max_size=60,
    )
)
@example(  # a session that ran again must leave the idle line, whatever its place in it
    [("begin", "a", 0), ("end", "a", 0), ("begin", "a", 0), ("wait", "a", 40), ("step", "a", 0)]
)
@example(  # the idle line is ordered by the latest end: a turn moves its session to the back
    [("begin", "a", 0), ("end", "a", 0), ("begin", "b", 0), ("wait", "a", 20),
     ("end", "b", 0), ("begin", "a", 0), ("end", "a", 0), ("wait", "a", 15), ("step", "a", 0)]
)  # fmt: skip
def test_the_ordered_expiry_ends_the_same_sessions_as_a_scan(ops: list[Any]) -> None:
    clock = Clock()
    book = SessionBook(per_step=1000, idle_s=30.0, clock=clock)
    ref = ScanBook(30.0)
    running: dict[str, int] = {}
    for op, key, dt in ops:
        if op == "begin":
            book.begin(key, 5)
            ref.begin(key, clock.t)
            running[key] = running.get(key, 0) + 1
        elif op == "end" and running.get(key):
            book.end(key, 5, 1)
            ref.end(key, clock.t)
            running[key] -= 1
        elif op == "wait":
            clock.t += dt
        elif op == "boundary":
            book.boundary()
            ref.boundary()
        elif op == "step":
            book.expire()
            ref.expire(clock.t)
        assert set(book.open) == set(ref.open)
        assert sorted(s.key for s in book.ended) == sorted(ref.ended)  # ended: by end time


def test_an_ended_session_is_forgotten_and_ids_are_bounded() -> None:
    clock = Clock()
    book = SessionBook(per_step=1, idle_s=10.0, clock=clock)
    for k in range(1000):
        key = book.begin(f"s{k}".ljust(MAX_SESSION_BYTES, "x"), 5)
        book.end(key, 5, 1)
    clock.t += 10.0
    while book.take_step() is not None:
        pass
    assert book.open == {} and book.ended == [] and len(book.recent) == RECENT
    assert session_problem("x" * MAX_SESSION_BYTES) is None
    assert "at most 256 bytes" in str(session_problem("x" * (MAX_SESSION_BYTES + 1)))
    assert session_problem("é" * 129) is not None  # 258 bytes of UTF-8


def test_a_session_id_over_256_bytes_is_refused_before_the_backend(
    client: TestClient, backend: ScriptedBackend
) -> None:
    body = {"model": "scripted-model", "prompt": "hi", "max_tokens": 2}
    ok = "s" * MAX_SESSION_BYTES
    assert (
        client.post("/v1/completions", json=body, headers={"X-Session-ID": ok}).status_code == 200
    )
    long = "é" * 129  # 258 bytes of UTF-8
    r = client.post("/v1/completions", json=body, headers={"X-Session-ID": "s" * 257})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Session-ID"
    r = client.post("/v1/completions", json={**body, "user": long})
    assert r.status_code == 400 and r.json()["error"]["param"] == "user"
    assert "at most 256 bytes" in r.json()["error"]["message"]
    chat = {"model": "scripted-model", "messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", json={**chat, "user": long}).status_code == 400
    r = client.post("/generate", json={"text": "hi"}, headers={"X-Session-ID": "s" * 300})
    assert r.status_code == 400
    assert [c.session for c in backend.calls] == [ok]
