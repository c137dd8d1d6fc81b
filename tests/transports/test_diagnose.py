"""A client that hears nothing is told why: authentication failed (and which way), or nobody
listens; and what to check (``--keys-dir``)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from transports import diagnose as dg
from transports.auth import ClientKeys, ServerKeys, generate
from transports.protocol import Ping, Pong
from transports.rpc import RequestTimeout, Server, dispatch

Ctx = zmq.Context[Any]
HANDLER = dispatch({Ping: lambda env: Pong(nonce=env.msg.nonce)})


@pytest.fixture
def keydir(tmp_path: Path) -> Path:
    generate(tmp_path / "keys")
    generate(tmp_path / "other")  # another deployment's keys
    return tmp_path / "keys"


@pytest.fixture
def servers(ctx: Ctx, keydir: Path) -> Iterator[tuple[str, str]]:
    """A CURVE server and a plain one, on loopback."""
    with (
        Server("tcp://127.0.0.1:*", HANDLER, ctx=ctx, keys=ServerKeys.load(keydir)) as curve,
        Server("tcp://127.0.0.1:*", HANDLER, ctx=ctx) as plain,
    ):
        yield curve.address, plain.address


def test_probe_names_each_way_a_handshake_ends(ctx: Ctx, keydir: Path, servers: Any) -> None:
    curve, plain = servers
    good = ClientKeys.load(keydir)
    other = ClientKeys.load(keydir.parent / "other")
    public, secret = zmq.curve_keypair()
    cases = [
        (curve, good, dg.OK),
        (curve, ClientKeys.load(keydir, "worker"), dg.OK),
        (curve, None, dg.NEEDS_KEYS),
        (curve, ClientKeys(public, secret, good.server_public), dg.DENIED),
        (curve, other, dg.BAD_SERVER_KEY),  # keys of another deployment
        (plain, good, dg.NO_CURVE),
        (plain, None, dg.OK),
    ]
    for address, keys, verdict in cases:
        t0 = time.monotonic()
        assert dg.probe(address, keys, ctx=ctx) == verdict, (address, verdict)
        assert time.monotonic() - t0 < 0.5  # a handshake answers at once
    t0 = time.monotonic()  # refused: said at once, not after the timeout
    assert dg.probe("tcp://127.0.0.1:1", good, timeout_s=30, ctx=ctx) == dg.UNREACHABLE
    assert dg.probe(f"ipc://{keydir}/none.sock", None, timeout_s=30, ctx=ctx) == dg.UNREACHABLE
    assert time.monotonic() - t0 < 5.0
    with socket.create_server(("127.0.0.1", 0)) as silent:  # TCP accepted, never a ZMTP greeting
        t0 = time.monotonic()
        address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        assert dg.probe(address, good, timeout_s=0.3, ctx=ctx) == dg.UNREACHABLE
        assert 0.25 < time.monotonic() - t0 < 5.0  # bounded by its timeout
    assert dg.probe("tcp://no such host", None, ctx=ctx) == dg.UNREACHABLE


def test_diagnosing_client_says_authentication_failed_and_what_to_check(
    ctx: Ctx, keydir: Path, servers: Any
) -> None:
    curve, _ = servers
    other = keydir.parent / "other"

    def refusal(keys: ClientKeys | None, keys_dir: str = "", **kw: Any) -> str:
        with (
            dg.DiagnosingClient(
                curve, ctx=ctx, keys=keys, keys_dir=keys_dir, timeout_s=0.3, retries=0, **kw
            ) as c,
            pytest.raises(RequestTimeout) as e,
        ):
            c.request(Ping(nonce=1))
        return str(e.value)

    msg = refusal(None)
    assert "authentication failed" in msg and "requires CURVE keys" in msg
    assert "pass --keys-dir DIR" in msg and f"no reply from {curve}" in msg
    msg = refusal(ClientKeys.load(other), str(other))
    assert "authentication failed" in msg and f"check --keys-dir {other}" in msg
    msg = refusal(None, option="keys_dir")  # pearl.connect's wording
    assert "pass keys_dir=DIR" in msg
    with dg.DiagnosingClient(curve, ctx=ctx, keys=ClientKeys.load(keydir), timeout_s=2) as c:
        assert c.request(Ping(nonce=2)) == Pong(nonce=2)  # the right keys: no change at all
    with (
        dg.DiagnosingClient("tcp://127.0.0.1:1", ctx=ctx, timeout_s=0.2, retries=0) as c,
        pytest.raises(RequestTimeout, match="unreachable.*check the endpoint"),
    ):
        c.request(Ping(nonce=3))


def test_diagnosing_client_answers_within_its_timeout_retries_and_diagnosis_included(
    ctx: Ctx, tmp_path: Path
) -> None:
    for address in ("tcp://127.0.0.1:1", f"ipc://{tmp_path}/none.sock"):
        with dg.DiagnosingClient(address, ctx=ctx, timeout_s=1.0, retries=3) as c:
            t0 = time.monotonic()
            within = r"within 1s \(4 attempts\): .* is unreachable"
            with pytest.raises(RequestTimeout, match=within) as e:
                c.request(Ping(nonce=1))
            assert time.monotonic() - t0 < 2.0  # 4 attempts of 1 s each before
            assert "\n" not in str(e.value)


def test_diagnosing_client_hears_its_own_handshakes_request_by_request(
    ctx: Ctx, tmp_path: Path
) -> None:
    """The diagnosis is what this request's sockets heard: with nothing at the address a
    request is "unreachable"; once a server that accepts and never answers is there, the next
    request of the same client is "did not answer in time". (A server going away is not used:
    when libzmq lets go of a closed listener is not ours to wait for.)"""
    address = f"ipc://{tmp_path}/silent.sock"
    with dg.DiagnosingClient(address, ctx=ctx, timeout_s=0.5, retries=1) as c:
        with pytest.raises(RequestTimeout, match="is unreachable"):
            c.request(Ping(nonce=1))
        silent = Server(address, None, ctx=ctx)  # bound, never served: accepts, answers nothing
        try:
            with pytest.raises(RequestTimeout, match="accepted the connection but did not answer"):
                c.request(Ping(nonce=2))
        finally:
            silent.close()
