"""Server and Client: bad input gets an error reply and the server keeps serving; Lazy Pirate."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import zmq

from pearl.core.errors import InvalidEvent, PearlError
from pearl.core.events import GpusAdded, TrainingBegin
from pearl.testing.wait import wait_until
from tests.transports.test_codec import BAD, OVERSIZE, SMALL, _envelope
from transports.codec import Codec, Envelope
from transports.heartbeat import Liveness
from transports.protocol import (
    Ack,
    Call,
    Error,
    ErrorCode,
    Event,
    Limits,
    Ping,
    Pong,
    Result,
    Status,
    StatusRequest,
)
from transports.rpc import (
    MALFORMED,
    Client,
    RemoteError,
    Reply,
    RequestTimeout,
    Server,
    dispatch,
)

Ctx = zmq.Context[Any]


class Api:
    """A small stand-in for the pearld API endpoint."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.calls = 0

    def event(self, env: Envelope) -> Ack:
        self.calls += 1
        rec = env.msg.decoded
        if isinstance(rec, TrainingBegin) and rec.step > 1000:  # within bounds, refused here
            raise InvalidEvent(f"training step must be <= 1000, got {rec.step}")
        self.events.append(rec)
        return Ack(seq=len(self.events))

    def call(self, env: Envelope) -> Any:
        if env.msg.method == "boom":
            raise RuntimeError("kaboom")
        if env.msg.method == "bulk":
            return Reply(Result(value=len(env.frames)), [bytes(f)[::-1] for f in env.frames])
        if env.msg.method == "unsendable":
            return Result(value={"x": object()})
        return Result(value=env.msg.args)

    def handler(self) -> Callable[[Envelope], Any]:
        return dispatch(
            {
                Ping: lambda env: Pong(nonce=env.msg.nonce),
                StatusRequest: lambda env: Status(),
                Event: self.event,
                Call: self.call,
            }
        )


@pytest.fixture
def api() -> Api:
    return Api()


@pytest.fixture
def server(ctx: Ctx, api: Api) -> Iterator[Server]:
    with Server("tcp://127.0.0.1:*", api.handler(), ctx=ctx, limits=SMALL_SERVER) as s:
        yield s


SMALL_SERVER = Limits(max_envelope=4096, max_frame=1 << 16, max_message=1 << 17, max_frames=8)


@pytest.fixture
def client(ctx: Ctx, server: Server) -> Iterator[Client]:
    with Client(server.address, ctx=ctx, timeout_s=2.0, retries=0) as c:
        yield c


@pytest.fixture
def raw(ctx: Ctx, server: Server) -> Iterator[zmq.Socket[Any]]:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(server.address)
    yield sock
    sock.close()


def recv_reply(sock: zmq.Socket[Any], timeout_s: float = 2.0) -> Envelope:
    assert sock.poll(int(timeout_s * 1000)), "no reply"
    return Codec().decode(sock.recv_multipart())


def test_request_reply(client: Client, api: Api) -> None:
    assert client.request(Ping(nonce=42)) == Pong(nonce=42)
    assert client.request(Event.of(GpusAdded(gpus=(8, 9)))) == Ack(seq=1)
    assert api.events == [GpusAdded(gpus=(8, 9))]
    assert client.request(StatusRequest()) == Status()
    assert client.request(Call(actor="sched", method="echo", args={"a": [1, 2]})) == Result(
        value={"a": [1, 2]}
    )


def test_bulk_frames_both_ways(client: Client) -> None:
    env = client.request_envelope(
        Call(actor="w", method="bulk", args={}), frames=[b"abc", memoryview(b"xyz")]
    )
    assert env.msg == Result(value=2)
    assert [bytes(f) for f in env.frames] == [b"cba", b"zyx"]


def test_handler_errors_become_error_replies(client: Client, server: Server) -> None:
    with pytest.raises(RemoteError) as e:
        client.request(Event.of(TrainingBegin(step=1001)))
    assert e.value.code == ErrorCode.REJECTED and "InvalidEvent" in str(e.value)
    with pytest.raises(RemoteError) as e:
        client.request(Call(actor="w", method="boom", args={}))
    assert e.value.code == ErrorCode.INTERNAL and "kaboom" in str(e.value)
    with pytest.raises(RemoteError) as e:
        client.request(Call(actor="w", method="unsendable", args={}))
    assert e.value.code == ErrorCode.INTERNAL
    with pytest.raises(RemoteError) as e:
        client.request(Pong())  # valid kind, not served
    assert e.value.code == ErrorCode.UNEXPECTED
    assert client.request(Ping(nonce=1)) == Pong(nonce=1)
    assert server.rejected == 4


_PING = _envelope("ping", {"kind": "ping", "v": 1})
CASES = {k: (f, c) for k, (f, c) in BAD.items() if f}
CASES["oversize-envelope"] = ([b"\x00" * 4097], ErrorCode.TOO_LARGE)
CASES["oversize-frame"] = ([_PING, b"\x00" * 70000], ErrorCode.TOO_LARGE)
CASES["oversize-message"] = ([_PING] + [b"\x00" * 60000] * 3, ErrorCode.TOO_LARGE)
CASES["too-many-frames"] = ([_PING] + [b""] * 8, ErrorCode.TOO_LARGE)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_request_gets_error_reply_and_server_keeps_serving(
    name: str, raw: zmq.Socket[Any], client: Client
) -> None:
    frames, code = CASES[name]
    raw.send_multipart(frames)
    reply = recv_reply(raw)
    assert isinstance(reply.msg, Error) and reply.msg.code == code, reply.msg
    assert reply.corr in (0, 5)  # the request's id when the envelope could be read
    assert client.request(Ping(nonce=3)) == Pong(nonce=3)


def test_codec_oversize_cases_match_the_server_limits() -> None:
    assert set(OVERSIZE) == {"envelope", "frame", "message", "frame-count"}
    assert SMALL.max_envelope < SMALL_SERVER.max_envelope


def test_frame_over_the_hard_cap_drops_that_peer_only(
    ctx: Ctx, raw: zmq.Socket[Any], client: Client
) -> None:
    raw.send_multipart([b"\x00" * (SMALL_SERVER.max_message + 1)])  # libzmq: MAXMSGSIZE
    assert not raw.poll(300)
    assert client.request(Ping(nonce=9)) == Pong(nonce=9)


def test_fuzz_thousands_of_random_messages(raw: zmq.Socket[Any], client: Client) -> None:
    rng = random.Random(1234)
    valid = Codec().encode(Ping(nonce=1), id=5, sender="fuzz")[0]

    def garbage() -> list[bytes]:
        r = rng.random()
        if r < 0.3:
            first = rng.randbytes(rng.randrange(0, 300))
        elif r < 0.55:
            obj = rng.choice(
                [
                    {"proto": 1, "kind": rng.choice(["ping", "event", "x"]), "body": rng.random()},
                    [rng.random()] * rng.randrange(5),
                    "x" * rng.randrange(50),
                    {
                        "proto": rng.randrange(3),
                        "id": 1,
                        "corr": 0,
                        "sender": "",
                        "kind": "ping",
                        "body": {"kind": "ping", "v": 1, "nonce": rng.choice([1, "x", None, 2.5])},
                    },
                ]
            )
            first = msgpack.packb(obj)
        elif r < 0.8:
            first = valid[: rng.randrange(len(valid))]
        else:
            first = bytearray(valid)
            first[rng.randrange(len(first))] = rng.randrange(256)
            first = bytes(first)
        extra = [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.choice([0, 0, 1, 3, 12]))]
        return [first, *extra]

    sent = 0
    for _ in range(10):  # batches, reading every reply so no queue overflows
        for _ in range(300):
            raw.send_multipart(garbage())
        sent += 300
        for _ in range(300):
            reply = recv_reply(raw)  # exactly one reply per message, error or not
            assert isinstance(reply.msg, Error | Pong)
    assert not raw.poll(50)
    assert sent == 3000
    assert client.request(Ping(nonce=77)) == Pong(nonce=77)


def test_retried_request_runs_the_handler_once(raw: zmq.Socket[Any], api: Api) -> None:
    req = Codec().encode(Event.of(GpusAdded(gpus=(1,))), id=99, sender="retrier")
    raw.send_multipart(req)
    first = recv_reply(raw)
    raw.send_multipart(req)  # same sender and id: a Lazy Pirate retry
    second = recv_reply(raw)
    assert first.msg == second.msg == Ack(seq=1) and first.corr == second.corr == 99
    assert api.calls == 1


def test_timeout_then_reconnect_when_the_server_comes_up(
    ctx: Ctx, ipc: Callable[[], str], api: Api
) -> None:
    address = ipc()
    with Client(address, ctx=ctx, timeout_s=0.15, retries=1, backoff_s=0.01) as c:
        t0 = time.monotonic()
        with pytest.raises(RequestTimeout, match="after 2 attempt"):
            c.request(Ping(nonce=1))
        assert 0.3 <= time.monotonic() - t0 < 1.5
        assert c.reconnects >= 1
        holder: list[Server] = []
        starter = threading.Timer(
            0.3, lambda: holder.append(Server(address, api.handler(), ctx=ctx))
        )
        starter.start()
        try:
            assert c.request(Ping(nonce=2), timeout_s=0.2, retries=20) == Pong(nonce=2)
        finally:
            starter.join()
            for s in holder:
                s.close()
        assert c.reconnects >= 3


def test_a_whole_timeout_bounds_the_request_with_its_retries(
    ctx: Ctx, ipc: Callable[[], str]
) -> None:
    with Client(ipc(), ctx=ctx, timeout_s=1.0, retries=3, whole_timeout=True) as c:
        t0 = time.monotonic()
        with pytest.raises(RequestTimeout, match=r"within 1s \(4 attempts\)"):
            c.request(Ping(nonce=1))
        assert time.monotonic() - t0 < 2.5  # per attempt, the same client took 4 s and more
        assert c.reconnects >= 4  # every attempt was made, on its share of the second


def test_a_whole_timeout_retry_is_answered_from_the_reply_cache(
    ctx: Ctx, ipc: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    gave_up = threading.Event()  # the client's first attempt has timed out
    calls: list[int] = []

    class Told(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "attempt 1/" in record.getMessage():
                gave_up.set()

    def slow(env: Envelope) -> Pong:  # answers only once the first attempt gave up on it
        calls.append(env.msg.nonce)
        assert gave_up.wait(10.0)
        return Pong(nonce=env.msg.nonce)

    told = Told()
    logging.getLogger("transports.rpc").addHandler(told)
    caplog.set_level(logging.INFO, "transports.rpc")
    address = ipc()
    try:
        with (
            Server(address, dispatch({Ping: slow}), ctx=ctx),
            Client(address, ctx=ctx, timeout_s=8.0, retries=3, whole_timeout=True) as c,
        ):
            assert c.request(Ping(nonce=7)) == Pong(nonce=7)
            assert calls == [7] and c.reconnects >= 1  # retried, and the handler ran once
    finally:
        logging.getLogger("transports.rpc").removeHandler(told)


def test_a_bound_server_answers_what_waited_once_it_serves(
    ctx: Ctx, ipc: Callable[[], str], api: Api
) -> None:
    address = ipc()
    Server(address, None, ctx=ctx).close()  # bound, never served: closes at once
    server = Server(address, None, ctx=ctx)
    raw = ctx.socket(zmq.DEALER)
    raw.linger = 0
    try:
        raw.connect(address)
        raw.send_multipart(Codec().encode(Ping(nonce=5), id=1, sender="early"))
        assert not raw.poll(100)  # bound, queued, not answered yet
        server.serve(api.handler())
        assert recv_reply(raw).msg == Pong(nonce=5)
        with pytest.raises(PearlError, match="already serving"):
            server.serve(api.handler())
    finally:
        raw.close()
        server.close()


def test_server_restart_mid_session(ctx: Ctx, ipc: Callable[[], str], api: Api) -> None:
    address = ipc()
    s1 = Server(address, api.handler(), ctx=ctx)
    with Client(address, ctx=ctx, timeout_s=0.2, retries=10, backoff_s=0.01) as c:
        assert c.request(Ping(nonce=1)) == Pong(nonce=1)
        s1.close()
        s2 = Server(address, api.handler(), ctx=ctx)
        try:
            assert c.request(Ping(nonce=2)) == Pong(nonce=2)
        finally:
            s2.close()


def test_client_is_safe_to_share_between_threads(client: Client) -> None:
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(100):
                n = k * 1000 + i
                assert client.request(Ping(nonce=n)) == Pong(nonce=n)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_any_message_counts_as_a_heartbeat(ctx: Ctx, api: Api) -> None:
    now = [100.0]
    live = Liveness(interval_s=1.0, clock=lambda: now[0])
    with (
        Server("tcp://127.0.0.1:*", api.handler(), ctx=ctx, liveness=live) as s,
        Client(s.address, ctx=ctx, name="worker-3") as c,
    ):
        c.request(StatusRequest())
        assert live.alive("worker-3")
        now[0] += 3.0
        # Silence is judged once the server's loop has polled empty at the new time (<= 0.1 s).
        wait_until(lambda: live.dead() == ["worker-3"], 2.0, "worker-3 judged dead", every=0.01)


def test_one_way_messages_and_stale_replies(ctx: Ctx, server: Server, client: Client) -> None:
    assert client.send(Ping(nonce=5))  # the server replies; request() must skip that reply
    assert client.request(Ping(nonce=6)) == Pong(nonce=6)


def test_close_is_prompt_and_idempotent(ctx: Ctx, api: Api) -> None:
    s = Server("tcp://127.0.0.1:*", api.handler(), ctx=ctx)
    t0 = time.monotonic()
    s.close()
    s.close()
    assert time.monotonic() - t0 < 0.5


def test_bind_failure_leaves_no_socket_open(ctx: Ctx, api: Api, server: Server) -> None:
    with pytest.raises(zmq.ZMQError):
        Server(server.address, api.handler(), ctx=ctx)  # address in use


def test_the_observer_hears_every_message_with_its_kind_and_outcome(ctx: Ctx, api: Api) -> None:
    heard: list[tuple[str, str, float]] = []
    with (
        Server(
            "tcp://127.0.0.1:*",
            api.handler(),
            ctx=ctx,
            observer=lambda kind, outcome, s: heard.append((kind, outcome, s)),
        ) as s,
        Client(s.address, ctx=ctx, timeout_s=2.0, retries=0) as c,
    ):
        c.request(Ping(nonce=1))
        c.request(Event.of(GpusAdded(gpus=(8,))))
        with pytest.raises(RemoteError):
            c.request(Event.of(TrainingBegin(step=1001)))
        with pytest.raises(RemoteError):
            c.request(Call(actor="w", method="boom", args={}))
        with pytest.raises(RemoteError):
            c.request(Pong())
        raw = ctx.socket(zmq.DEALER)
        raw.linger = 0
        raw.connect(s.address)
        raw.send_multipart([b"not msgpack"])
        assert isinstance(recv_reply(raw).msg, Error)
        raw.close()
    assert [(k, o) for k, o, _ in heard] == [
        ("ping", "ok"),
        ("event", "ok"),
        ("event", ErrorCode.REJECTED),
        ("call", ErrorCode.INTERNAL),
        ("pong", ErrorCode.UNEXPECTED),
        (MALFORMED, ErrorCode.MALFORMED),
    ]
    assert all(0 <= sec < 2.0 for _, _, sec in heard)
