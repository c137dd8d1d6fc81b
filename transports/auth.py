"""Who may talk to a PEARL socket: loopback by default, CURVE for anything else.

A socket binds without keys only to a local endpoint (``ipc://``, ``inproc://``,
``tcp://127.0.0.1``, ``tcp://localhost``, ``tcp://[::1]``). Binding any other address needs ZeroMQ
CURVE keys: the server's secret key and a directory of client public keys that may connect;
without them :func:`check_bind` refuses to start. A client whose key is not in that directory
fails the handshake, so it never gets a reply (its requests time out).

Key directory, as ``pearl keys generate DIR`` writes it (zcert text format, readable by
``zmq.auth.load_certificate``)::

    DIR/server.key                 server public key: copy to every client machine
    DIR/server.key_secret          server secret key: stays with pearld (mode 0600)
    DIR/<name>.key_secret          a client's key pair: copy to that client (mode 0600)
    DIR/authorized_clients/<name>.key   client public keys the server accepts
"""

from __future__ import annotations

import ipaddress
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from pearl.core.errors import ConfigError

AUTHORIZED_DIR = "authorized_clients"
HOW_TO = "create keys with `pearl keys generate DIR`"


class InsecureBind(ConfigError):
    """A socket would listen on a non-local address without CURVE keys."""


def is_local(address: str) -> bool:
    """True for ipc://, inproc:// and TCP endpoints on a loopback host."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        return False
    if scheme in ("ipc", "inproc"):
        return True
    if scheme != "tcp":
        return False
    host = rest.rsplit(":", 1)[0] if not rest.startswith("[") else rest[1 : rest.find("]")]
    host = host.split(";")[-1]  # tcp://source;dest form: the bound side is the last
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # an interface name or hostname: may be reachable from outside


@dataclass(frozen=True, slots=True)
class ServerKeys:
    """A CURVE server's key pair and the z85 public keys of clients allowed to connect."""

    public: bytes
    secret: bytes
    authorized: frozenset[bytes]

    @classmethod
    def load(cls, keydir: str | os.PathLike[str]) -> ServerKeys:
        d = Path(keydir)
        public, secret = _load(d / "server.key_secret", secret=True)
        adir = d / AUTHORIZED_DIR
        if not adir.is_dir():
            raise ConfigError(f"{adir}: no directory of authorized client keys; {HOW_TO}")
        keys = frozenset(_load(p, secret=False)[0] for p in sorted(adir.glob("*.key")))
        if not keys:
            raise ConfigError(f"{adir}: no client public keys (*.key), nobody could connect")
        return cls(public, secret, keys)


@dataclass(frozen=True, slots=True)
class ClientKeys:
    """A CURVE client's key pair and the public key of the server it trusts."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def load(cls, keydir: str | os.PathLike[str], name: str = "client") -> ClientKeys:
        d = Path(keydir)
        public, secret = _load(d / f"{name}.key_secret", secret=True)
        server_public, _ = _load(d / "server.key", secret=False)
        return cls(public, secret, server_public)


def _load(path: Path, secret: bool) -> tuple[bytes, bytes]:
    try:
        public, sec = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read CURVE key ({e}); {HOW_TO}") from None
    if secret and not sec:
        raise ConfigError(f"{path}: holds no secret key; {HOW_TO}")
    return public, sec or b""


def check_bind(address: str, keys: ServerKeys | None) -> None:
    """Refuse to listen on a non-local address without CURVE keys."""
    if keys is None and not is_local(address):
        raise InsecureBind(
            f"refusing to bind {address} without CURVE keys: it may be reachable from other "
            f"machines. Bind tcp://127.0.0.1:PORT or ipc:// instead, or {HOW_TO} and pass "
            "ServerKeys.load(DIR)"
        )


def generate(
    keydir: str | os.PathLike[str], clients: tuple[str, ...] = ("client",), force: bool = False
) -> list[Path]:
    """Write the server key pair (unless present) and one key pair per client; returns the files.

    Running it again on the same directory with new client names adds those clients.
    """
    d = Path(keydir)
    adir = d / AUTHORIZED_DIR
    server = [d / "server.key", d / "server.key_secret"]
    make_server = force or not all(p.exists() for p in server)
    targets = server if make_server else []
    for name in clients:
        if not name or "/" in name or name.startswith(".") or name == "server":
            raise ConfigError(f"client name {name!r}: use a plain file name other than 'server'")
        targets += [d / f"{name}.key_secret", adir / f"{name}.key"]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not force:
        raise ConfigError(f"keys exist already: {', '.join(existing)}; pass --force to replace")
    adir.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    if make_server:
        public, secret = zmq.curve_keypair()
        _write(d / "server.key", public, None)
        _write(d / "server.key_secret", public, secret)
    for name in clients:
        cpub, csec = zmq.curve_keypair()
        _write(d / f"{name}.key_secret", cpub, csec)
        _write(adir / f"{name}.key", cpub, None)
    return targets


def _write(path: Path, public: bytes, secret: bytes | None) -> None:
    """A zcert file; secret ones are created 0600 so no other user can ever read them."""
    lines = [
        "#   ZeroMQ CURVE " + ("Secret" if secret else "Public") + " Certificate (PEARL)",
        "metadata",
        "curve",
        f'    public-key = "{public.decode()}"',
    ]
    if secret:
        lines.append(f'    secret-key = "{secret.decode()}"')
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


# -- CURVE on sockets -------------------------------------------------------------------------


class _Zap:
    """One ZAP authenticator per context; each secured server socket gets its own domain."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self.allowed: dict[str, frozenset[bytes]] = {}
        self.auth = ThreadAuthenticator(ctx)
        self.auth.start()

    def callback(self, domain: str, client_key: bytes) -> bool:
        return client_key in self.allowed.get(domain, frozenset())


_ZAPS: dict[int, _Zap] = {}
_ZAP_LOCK = threading.Lock()
_DOMAINS = iter(range(1, 1 << 62))


def secure_server(sock: zmq.Socket[Any], keys: ServerKeys) -> str:
    """Make ``sock`` a CURVE server accepting only ``keys.authorized``; call before bind.

    Returns the ZAP domain to pass to :func:`release_server` when the socket is closed.
    """
    ctx = sock.context
    with _ZAP_LOCK:
        zap = _ZAPS.get(id(ctx))
        if zap is None:
            zap = _ZAPS[id(ctx)] = _Zap(ctx)
        domain = f"pearl-{next(_DOMAINS)}"
        zap.allowed[domain] = keys.authorized
        zap.auth.configure_curve_callback(domain, credentials_provider=zap)
    sock.zap_domain = domain.encode()
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    return domain


def release_server(ctx: zmq.Context[Any], domain: str) -> None:
    """Forget a closed server socket's domain; stop the authenticator after the last one."""
    with _ZAP_LOCK:
        zap = _ZAPS.get(id(ctx))
        if zap is None:
            return
        zap.allowed.pop(domain, None)
        zap.auth.credentials_providers.pop(domain, None)
        if not zap.allowed:
            del _ZAPS[id(ctx)]
            zap.auth.stop()


def secure_client(sock: zmq.Socket[Any], keys: ClientKeys) -> None:
    """Make ``sock`` a CURVE client of the server whose public key is ``keys.server_public``."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = keys.server_public


__all__ = [
    "AUTHORIZED_DIR",
    "ClientKeys",
    "InsecureBind",
    "ServerKeys",
    "check_bind",
    "generate",
    "is_local",
    "release_server",
    "secure_client",
    "secure_server",
]
