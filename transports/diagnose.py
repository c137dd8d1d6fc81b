"""Why a ZeroMQ client hears nothing: watch a fresh socket's handshake and say what went wrong.

A CURVE server never answers a client it does not accept (no keys, a key it does not know, the
wrong server key): the client's requests just time out. :func:`probe` connects a fresh socket with
the same keys and reads its socket monitor (``HANDSHAKE_SUCCEEDED``, ``HANDSHAKE_FAILED_AUTH``,
...), and :func:`diagnose` turns that into one sentence and what to do: "authentication failed
... check --keys-dir", or "unreachable". Used on the error path only; it sends nothing.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

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


PROBE_S = 1.0  # the longest a diagnosis waits for a handshake


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
    from zmq.utils.monitor import recv_monitor_message

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
    """Why ``address`` did not answer, and what to do: :func:`probe`, then advice naming the
    client's key option (``--keys-dir`` for the CLI, ``keys_dir`` for ``pearl.connect``)."""
    verdict = probe(address, keys, timeout_s=timeout_s, kind=kind, ctx=ctx)
    sep = " " if option.startswith("-") else "="  # "--keys-dir DIR" / "keys_dir=DIR"
    given = f"{option}{sep}{keys_dir}" if keys_dir else option
    advice = {
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
    return f"{explain(address, verdict)}; {advice}"


class DiagnosingClient(Client):
    """A :class:`~transports.rpc.Client` whose final timeout says why: its
    :class:`~transports.rpc.RequestTimeout` carries :func:`diagnose`'s sentence and advice.

    The client of a person or a trainer: ``timeout_s`` bounds the whole request, retries and
    diagnosis included (``whole_timeout``); the diagnosis takes a fifth of it, 1 s at most."""

    def __init__(
        self,
        address: str,
        *,
        keys_dir: str = "",
        option: str = "--keys-dir",
        whole_timeout: bool = True,
        **kw: Any,
    ) -> None:
        super().__init__(address, whole_timeout=whole_timeout, **kw)
        self.keys_dir, self.option = keys_dir, option

    def request_envelope(
        self, msg: Any, timeout_s: float | None = None, *args: Any, **kw: Any
    ) -> Any:
        total = self.timeout_s if timeout_s is None else timeout_s
        probe_s = min(PROBE_S, total / 5) if self.whole_timeout else PROBE_S
        try:
            return super().request_envelope(
                msg, total - probe_s if self.whole_timeout else total, *args, **kw
            )
        except RequestTimeout as e:
            what = (
                f"no reply from {self.address} to {msg.KIND!r} within {total:g}s"
                if self.whole_timeout
                else str(e).partition(";")[0]  # "no reply from X to 'status' after N attempt(s)"
            )
            why = diagnose(
                self.address,
                self.keys,
                self.keys_dir,
                option=self.option,
                timeout_s=probe_s,
                ctx=self.ctx,
            )
            raise RequestTimeout(f"{what}: {why}") from None


__all__ = [
    "BAD_SERVER_KEY",
    "DENIED",
    "DiagnosingClient",
    "NEEDS_KEYS",
    "NO_CURVE",
    "OK",
    "UNREACHABLE",
    "diagnose",
    "explain",
    "probe",
]
