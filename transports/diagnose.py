"""Why a ZeroMQ client hears nothing: watch a fresh socket's handshake and say what went wrong.

A CURVE server never answers a client it does not accept (no keys, a key it does not know, the
wrong server key): the client's requests just time out. :func:`probe` connects a fresh socket with
the same keys and reads its socket monitor (``HANDSHAKE_SUCCEEDED``, ``HANDSHAKE_FAILED_AUTH``,
...), and :func:`diagnose` turns that into one sentence and what to do: "authentication failed
... check --keys-dir", or "unreachable". Used on the error path only; it sends nothing.
:class:`DiagnosingClient` needs no probe: it monitors its own sockets while a request waits.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from pearl.core.schema import WireStruct
from transports.auth import ClientKeys, secure_client
from transports.rpc import Client, RequestTimeout

OK, NEEDS_KEYS, NO_CURVE, DENIED, BAD_SERVER_KEY, UNREACHABLE = (
    "ok", "needs-keys", "no-curve", "denied", "bad-server-key", "unreachable"
)  # fmt: skip
_VERDICTS = {
    NEEDS_KEYS: "authentication failed: {address} requires CURVE keys and none were given",
    NO_CURVE: "{address} does not use CURVE keys, but keys were given",
    DENIED: "authentication failed: {address} does not accept this client's key (its public "
    "key is not in the server's authorized_clients)",
    BAD_SERVER_KEY: "authentication failed: {address} refused the CURVE handshake (the server "
    "key given, server.key, is not this server's)",
    UNREACHABLE: "{address} is unreachable: nothing accepted a connection (is the server "
    "running, is the address right?)",
    OK: "{address} accepted the connection but did not answer in time (overloaded or stuck?)",
}


def probe(
    address: str,
    keys: ClientKeys | None,
    *,
    timeout_s: float = 1.0,
    kind: int = zmq.DEALER,
    ctx: zmq.Context[Any] | None = None,
) -> str:
    """Connect a fresh socket and watch its ZMTP handshake (a socket monitor); returns one of
    ``OK``, ``NEEDS_KEYS``, ``NO_CURVE``, ``DENIED``, ``BAD_SERVER_KEY``, ``UNREACHABLE``.

    For diagnosing a request that got no reply: it sends nothing, and takes at most
    ``timeout_s`` (the whole of it only when nothing answers at all: a refused connection is
    ``UNREACHABLE`` at once).
    """
    ctx = ctx or zmq.Context.instance()
    sock = ctx.socket(kind)
    sock.linger = 0
    if keys is not None:
        secure_client(sock, keys)
    mon = sock.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_CONNECT_RETRIED
    )
    verdict = UNREACHABLE
    try:
        sock.connect(address)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0 and mon.poll(int(left * 1000) + 1):
            event = recv_monitor_message(mon)["event"]
            if event == zmq.EVENT_CONNECT_RETRIED:
                break  # refused (no listener, no socket file): unreachable, known at once
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                verdict = OK
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                verdict = DENIED
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                verdict = NEEDS_KEYS if keys is None else NO_CURVE
            else:  # the server could not decrypt our hello: it is not the key we were given
                verdict = BAD_SERVER_KEY if keys is not None else NEEDS_KEYS
            break
    except zmq.ZMQError:
        pass  # a malformed address: nothing can be reached there
    finally:
        sock.disable_monitor()
        mon.close(linger=0)
        sock.close(linger=0)
    return verdict


def explain(address: str, verdict: str) -> str:
    """One sentence for a :func:`probe` verdict."""
    return _VERDICTS[verdict].format(address=address)


def advice(address: str, verdict: str, keys_dir: str = "", option: str = "--keys-dir") -> str:
    """:func:`explain`'s sentence and what to do, naming the client's key option (``--keys-dir``
    for the CLI, ``keys_dir`` for ``pearl.connect``)."""
    sep = " " if option.startswith("-") else "="  # "--keys-dir DIR" / "keys_dir=DIR"
    given = f"{option}{sep}{keys_dir}" if keys_dir else option
    todo = {
        NEEDS_KEYS: f"pass {option}{sep}DIR with the key directory pearld was started with "
        "(daemon.keys_dir; made by `pearl keys generate DIR`)",
        DENIED: f"check {given}: its client key pair must come from the directory pearld was "
        "started with (daemon.keys_dir)",
        BAD_SERVER_KEY: f"check {given}: its server.key must be the one of the directory pearld "
        "was started with (daemon.keys_dir)",
        NO_CURVE: f"this server runs without CURVE keys: drop {option}",
        UNREACHABLE: f"check the endpoint, that pearld is running there, and {option} if it uses "
        "CURVE keys",
        OK: "try again with a longer timeout",
    }[verdict]
    return f"{explain(address, verdict)}; {todo}"


def diagnose(
    address: str,
    keys: ClientKeys | None,
    keys_dir: str = "",
    *,
    option: str = "--keys-dir",
    timeout_s: float = 1.0,
    kind: int = zmq.DEALER,
    ctx: zmq.Context[Any] | None = None,
) -> str:
    """Why ``address`` did not answer, and what to do: :func:`probe`, then :func:`advice`."""
    verdict = probe(address, keys, timeout_s=timeout_s, kind=kind, ctx=ctx)
    return advice(address=address, verdict=verdict, keys_dir=keys_dir, option=option)


_SUCCEEDED = zmq.EVENT_HANDSHAKE_SUCCEEDED
_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH,
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
)
_DOWN = (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED, zmq.EVENT_MONITOR_STOPPED)


class DiagnosingClient(Client):
    """A :class:`~transports.rpc.Client` whose final timeout says why: its
    :class:`~transports.rpc.RequestTimeout` carries :func:`advice`'s sentence and what to do.

    The client of a person or a trainer: ``timeout_s`` bounds the whole request, its retries
    included (``whole_timeout``). The diagnosis costs no time: a monitor on each of the client's
    own sockets hears how their handshakes went while the request waited (refused, denied, the
    wrong server key, accepted and silent, or nothing at all)."""

    def __init__(
        self,
        address: str,
        *,
        keys_dir: str = "",
        option: str = "--keys-dir",
        whole_timeout: bool = True,
        **kw: Any,
    ) -> None:
        self.keys_dir, self.option = keys_dir, option
        self._mon: zmq.Socket[Any] | None = None  # the monitor of the client's socket
        self._up = False  # that socket's handshake succeeded and it is still connected
        self._heard: set[int] = set()  # handshake outcomes since the last request ended
        super().__init__(address, whole_timeout=whole_timeout, **kw)

    def _listen(self) -> None:
        """Read what the monitor has heard so far."""
        mon = self._mon
        while mon is not None and mon.poll(0):
            try:
                event = recv_monitor_message(mon, zmq.NOBLOCK)["event"]
            except zmq.Again:
                break
            if event == _SUCCEEDED:
                self._up = True
                self._heard.add(event)
            elif event in _FAILED:
                self._up = False
                self._heard.add(event)
            elif event in _DOWN:
                self._up = False

    def _connecting(self, sock: zmq.Socket[Any]) -> None:
        # A unique address: pyzmq's default names the socket's fd, which a new socket reuses.
        addr = f"inproc://pearl-client-monitor-{secrets.token_hex(8)}"
        self._mon = sock.get_monitor_socket(_SUCCEEDED | sum(_FAILED) | sum(_DOWN), addr)
        self._up = False

    def _closing(self, sock: zmq.Socket[Any]) -> None:
        self._listen()  # how its handshakes went, before its monitor goes
        # Stopped before the socket closes: a monitor left to the close can leave libzmq's
        # later monitors silent (seen: no event at all for the sockets made after it).
        sock.disable_monitor()
        if self._mon is not None:
            self._mon.close(linger=0)
            self._mon = None

    def _request_ends(self) -> None:
        self._listen()
        self._heard = set()  # what the next request's diagnosis hears starts now

    def _verdict(self) -> str:
        # A connection made before the request began and still up as it ends: the server
        # accepted us (judged at the end: a disconnect heard late must not count as accepted).
        heard = self._heard | ({_SUCCEEDED} if self._up else set())
        if zmq.EVENT_HANDSHAKE_FAILED_AUTH in heard:
            return DENIED
        if zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL in heard:
            return NEEDS_KEYS if self.keys is None else NO_CURVE
        if zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL in heard:  # our hello was not for this server
            return BAD_SERVER_KEY if self.keys is not None else NEEDS_KEYS
        return OK if _SUCCEEDED in heard else UNREACHABLE

    def _timeout(self, msg: WireStruct, timeout: float, tries: int) -> RequestTimeout:
        self._listen()
        what = str(super()._timeout(msg, timeout, tries)).partition(";")[0]
        why = advice(
            address=self.address,
            verdict=self._verdict(),
            keys_dir=self.keys_dir,
            option=self.option,
        )
        return RequestTimeout(f"{what}: {why}")


__all__ = [
    "BAD_SERVER_KEY",
    "DENIED",
    "DiagnosingClient",
    "NEEDS_KEYS",
    "NO_CURVE",
    "OK",
    "UNREACHABLE",
    "advice",
    "diagnose",
    "explain",
    "probe",
]
