"""Loopback by default; anything else needs CURVE keys, and only authorized clients get through."""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from pearl.cli import main as pearl_main
from pearl.core.errors import ConfigError
from transports.auth import (
    AUTHORIZED_DIR,
    ClientKeys,
    DaemonKeys,
    HostKeys,
    InsecureBind,
    ServerKeys,
    check_bind,
    generate,
    is_local,
)
from transports.bulk import ZmqKVChannel
from transports.protocol import Ping, Pong
from transports.pubsub import Publisher
from transports.rpc import Client, RequestTimeout, Server, dispatch

Ctx = zmq.Context[Any]
HANDLER = dispatch({Ping: lambda env: Pong(nonce=env.msg.nonce)})


@pytest.mark.parametrize(
    ("address", "local"),
    [
        ("tcp://127.0.0.1:*", True),
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.3.4.5:1", True),
        ("tcp://localhost:5555", True),
        ("tcp://[::1]:5555", True),
        ("ipc:///tmp/pearl.sock", True),
        ("inproc://x", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://10.0.0.7:5555", False),
        ("tcp://eth0:5555", False),
        ("tcp://[::]:5555", False),
        ("tcp://example.org:5555", False),
        ("udp://127.0.0.1:5555", False),
        ("127.0.0.1:5555", False),
    ],
)
def test_is_local(address: str, local: bool) -> None:
    assert is_local(address) is local


def test_non_local_bind_without_keys_is_refused(ctx: Ctx) -> None:
    with pytest.raises(InsecureBind, match="pearl keys generate DIR") as e:
        Server("tcp://0.0.0.0:*", HANDLER, ctx=ctx)
    assert "--set daemon.keys_dir=DIR" in str(e.value)  # what a pearld user types
    with pytest.raises(InsecureBind, match="pearl keys generate DIR"):
        Publisher("tcp://*:*", ctx=ctx)
    with pytest.raises(InsecureBind, match="daemon.keys_dir"):
        ZmqKVChannel("tcp://0.0.0.0:*", context=ctx)
    assert isinstance(InsecureBind("x"), ConfigError)
    check_bind("tcp://127.0.0.1:*", None)  # loopback is fine without keys


@pytest.fixture
def keydir(tmp_path: Path) -> Path:
    d = tmp_path / "keys"
    assert pearl_main(["keys", "generate", str(d), "--client", "cli", "--client", "worker"]) == 0
    return d


def test_keys_generate_layout_and_permissions(keydir: Path, capsys: pytest.CaptureFixture[str]):
    for name in ("server.key_secret", "cli.key_secret", "worker.key_secret"):
        assert stat.S_IMODE((keydir / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(keydir.stat().st_mode) == 0o700
    keys = ServerKeys.load(keydir)
    assert len(keys.authorized) == 2
    assert ClientKeys.load(keydir, "cli").server_public == keys.public
    zmq.auth.load_certificate(keydir / "server.key")  # readable by pyzmq's own loader
    # Again: refused, nothing overwritten; a new client name is added next to the old ones.
    before = (keydir / "server.key_secret").read_bytes()
    assert pearl_main(["keys", "generate", str(keydir), "--client", "cli"]) == 1
    assert "exist already" in capsys.readouterr().err
    assert pearl_main(["keys", "generate", str(keydir), "--client", "trainer"]) == 0
    assert (keydir / "server.key_secret").read_bytes() == before
    assert len(ServerKeys.load(keydir).authorized) == 3


def test_missing_or_empty_key_dirs_say_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pearl keys generate"):
        ServerKeys.load(tmp_path)
    generate(tmp_path / "k", clients=())
    for p in (tmp_path / "k" / AUTHORIZED_DIR).glob("*.key"):
        p.unlink()
    with pytest.raises(ConfigError, match="nobody could connect"):
        ServerKeys.load(tmp_path / "k")
    with pytest.raises(ConfigError, match="pearl keys generate"):
        ClientKeys.load(tmp_path / "k", "nobody")
    with pytest.raises(ConfigError):
        generate(tmp_path / "k", clients=("../evil",))


def test_generate_with_no_flags_writes_a_whole_deployment(tmp_path: Path) -> None:
    d = tmp_path / "keys"
    assert pearl_main(["keys", "generate", str(d)]) == 0
    daemon, host = DaemonKeys.load(d), HostKeys.load(d)
    client = ClientKeys.load(d)  # the CLI's default key pair
    assert {client.public, host.to_pearld.public} <= daemon.api.authorized
    assert host.to_pearld.server_public == daemon.api.public == client.server_public
    # pearld dials hosts with its own pair; hosts accept it and each other, nobody else.
    assert daemon.hosts.server_public == host.serve.public == host.to_peers.server_public
    assert host.serve.authorized == {daemon.api.public, host.to_peers.public}
    assert client.public not in host.serve.authorized
    # Again with no flags: nothing to add. A directory from before worker keys: they are added.
    assert pearl_main(["keys", "generate", str(d)]) == 1
    (d / "worker.key_secret").unlink()
    (d / AUTHORIZED_DIR / "worker.key").unlink()
    with pytest.raises(ConfigError, match="generate .* again"):
        DaemonKeys.load(d)
    with pytest.raises(ConfigError, match="generate .* again"):
        HostKeys.load(d)
    before = (d / "client.key_secret").read_bytes()
    assert generate(d) == [d / "worker.key_secret", d / AUTHORIZED_DIR / "worker.key"]
    assert (d / "client.key_secret").read_bytes() == before
    HostKeys.load(d)


@pytest.fixture
def curve_server(ctx: Ctx, keydir: Path) -> Iterator[tuple[Server, str]]:
    with Server("tcp://0.0.0.0:*", HANDLER, ctx=ctx, keys=ServerKeys.load(keydir)) as s:
        port = s.address.rsplit(":", 1)[1]
        yield s, f"tcp://127.0.0.1:{port}"


def test_authorized_curve_client_talks(ctx: Ctx, keydir: Path, curve_server: Any) -> None:
    _, address = curve_server
    for name in ("cli", "worker"):
        with Client(address, ctx=ctx, keys=ClientKeys.load(keydir, name), timeout_s=3) as c:
            assert c.request(Ping(nonce=5), retries=0) == Pong(nonce=5)


def _times_out(ctx: Ctx, address: str, keys: ClientKeys | None) -> None:
    with (
        Client(address, ctx=ctx, keys=keys, timeout_s=0.4, retries=0) as c,
        pytest.raises(RequestTimeout),
    ):
        c.request(Ping(nonce=1))


def test_unauthorized_client_key_gets_nothing(ctx: Ctx, keydir: Path, curve_server: Any) -> None:
    server, address = curve_server
    public, secret = zmq.curve_keypair()
    good = ClientKeys.load(keydir, "cli")
    _times_out(ctx, address, ClientKeys(public, secret, good.server_public))  # ZAP denies it
    _times_out(ctx, address, ClientKeys(good.public, good.secret, public))  # wrong server key
    _times_out(ctx, address, None)  # no CURVE at all
    assert server.served == 0 and server.rejected == 0  # nothing even reached the handler


def test_curve_servers_share_a_context_with_separate_allow_lists(ctx: Ctx, tmp_path: Path) -> None:
    generate(tmp_path / "a", ("ca",))
    generate(tmp_path / "b", ("cb",))
    with (
        Server("tcp://127.0.0.1:*", HANDLER, ctx=ctx, keys=ServerKeys.load(tmp_path / "a")) as sa,
        Server("tcp://127.0.0.1:*", HANDLER, ctx=ctx, keys=ServerKeys.load(tmp_path / "b")) as sb,
    ):
        ca = ClientKeys.load(tmp_path / "a", "ca")
        cb = ClientKeys.load(tmp_path / "b", "cb")
        with Client(sa.address, ctx=ctx, keys=ca, timeout_s=3, retries=0) as c:
            assert c.request(Ping(nonce=1)) == Pong(nonce=1)
        # cb's key pair, told sa's public key: the handshake works but sa's allow list refuses it.
        _times_out(ctx, sa.address, ClientKeys(cb.public, cb.secret, ca.server_public))
        with Client(sb.address, ctx=ctx, keys=cb, timeout_s=3, retries=0) as c:
            assert c.request(Ping(nonce=2)) == Pong(nonce=2)


def test_a_curve_server_started_right_after_the_last_one_closed_binds(
    ctx: Ctx, keydir: Path
) -> None:
    """Closing a context's last CURVE server stops its authenticator, whose inproc endpoint
    ZeroMQ's reaper frees a moment later; the next server must wait that out, not fail with
    'Address already in use' (seen in a full run as a pearld that could not start)."""
    keys = ServerKeys.load(keydir)
    for n in range(100):
        client = ClientKeys.load(keydir, "cli")
        with (
            Server("tcp://127.0.0.1:*", HANDLER, ctx=ctx, keys=keys) as s,
            Client(s.address, ctx=ctx, keys=client, timeout_s=3) as c,
        ):
            assert c.request(Ping(nonce=n)) == Pong(nonce=n)


def test_curve_publisher_and_subscriber(ctx: Ctx, keydir: Path) -> None:
    from transports.protocol import Subscribe
    from transports.pubsub import Subscriber

    got: list[tuple[int, dict[str, Any]]] = []
    keys = ClientKeys.load(keydir, "worker")
    with Publisher("tcp://0.0.0.0:*", ctx=ctx, keys=ServerKeys.load(keydir)) as pub:
        snap = dispatch({Subscribe: lambda env: pub.snapshot(lambda: {"n": 0})})
        with (
            Server("tcp://127.0.0.1:*", snap, ctx=ctx, keys=ServerKeys.load(keydir)) as srv,
            Client(srv.address, ctx=ctx, keys=keys, timeout_s=3) as client,
        ):
            port = pub.address.rsplit(":", 1)[1]
            with Subscriber(
                f"tcp://127.0.0.1:{port}",
                client,
                ctx=ctx,
                keys=keys,
                on_snapshot=lambda seq, p: got.append((seq, p)),
                on_change=lambda seq, p: got.append((seq, p)),
            ) as sub:
                assert sub.sync() == 0
                pub.publish({"n": 1})
                deadline = time.monotonic() + 5
                while len(got) < 2:
                    assert time.monotonic() < deadline
                    sub.pump(0.05)
    assert got == [(0, {"n": 0}), (1, {"n": 1})]


def test_curve_kv_channel_between_hosts(ctx: Ctx, keydir: Path) -> None:
    """Worker hosts' KV inboxes accept pushes from hosts with the worker key, nobody else."""
    host = HostKeys.load(keydir)
    a = ZmqKVChannel("tcp://0.0.0.0:*", context=ctx, keys=host.serve, peer_keys=host.to_peers)
    b = ZmqKVChannel("tcp://0.0.0.0:*", context=ctx, keys=host.serve, peer_keys=host.to_peers)
    public, secret = zmq.curve_keypair()
    stranger = ZmqKVChannel(
        context=ctx, peer_keys=ClientKeys(public, secret, host.serve.public), send_timeout_s=0.2
    )
    plain = ZmqKVChannel(context=ctx, send_timeout_s=0.2)
    try:
        to_b = f"tcp://127.0.0.1:{b.address.rsplit(':', 1)[1]}"
        a.send(to_b, "t1", {"n": 1}, [b"kv-bytes"])
        meta, frames = b.receive("t1", 5.0)
        assert meta["n"] == 1 and bytes(frames[0]) == b"kv-bytes"
        for other in (stranger, plain):  # queued, never delivered: the handshake fails
            other.send(to_b, "t2", {}, [b"x"])
        assert b.poll("t2") is None
        time.sleep(0.3)  # no event: a failed handshake is silent; give delivery its chance
        assert b.poll("t2") is None
    finally:
        for ch in (a, b, stranger, plain):
            ch.close()
