"""Who may talk to a PEARL socket: loopback by default, CURVE for anything else.

A socket binds without keys only to a local endpoint (``ipc://``, ``inproc://``,
``tcp://127.0.0.1``, ``tcp://localhost``, ``tcp://[::1]``). Binding any other address needs ZeroMQ
CURVE keys: the server's secret key and a directory of client public keys that may connect;
without them :func:`check_bind` refuses to start. A client whose key is not in that directory
fails the handshake, so it never gets a reply; :mod:`transports.diagnose` tells it why.

Key directory, as ``pearl keys generate DIR`` writes it (zcert text format, readable by
``zmq.auth.load_certificate``)::

    DIR/server.key                 server public key: copy to every client machine
    DIR/server.key_secret          server secret key: stays with pearld (mode 0600)
    DIR/worker.key_secret          the worker hosts' key pair (always written; mode 0600)
    DIR/client.key_secret          the CLI's and trainers' key pair (``--client NAME`` for others)
    DIR/authorized_clients/<name>.key   client public keys the server accepts

Who uses what when pearld runs with ``daemon.keys_dir=DIR`` (:class:`DaemonKeys`,
:class:`HostKeys`): pearld's API and change stream are CURVE servers with the server key pair,
accepting every authorized client (worker hosts included). A worker host dials pearld with the
worker key pair; its own sockets (the command server pearld dials, the KV inbox other hosts push
to) are CURVE servers with the worker key pair that accept only pearld's and the worker key.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from pearl.core.address import is_local
from pearl.core.errors import ConfigError, InsecureBind

AUTHORIZED_DIR = "authorized_clients"
WORKER = "worker"  # the key pair every worker host uses
CLIENT = "client"  # the key pair the CLI and trainers use by default
HOW_TO = "create keys with `pearl keys generate DIR`"


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


@dataclass(frozen=True, slots=True)
class DaemonKeys:
    """pearld's keys: its API and change stream (``api``), and how it dials worker hosts."""

    api: ServerKeys
    hosts: ClientKeys  # the server key pair, trusting the worker hosts' public key

    @classmethod
    def load(cls, keydir: str | os.PathLike[str]) -> DaemonKeys:
        d = Path(keydir)
        api = ServerKeys.load(d)
        path = d / AUTHORIZED_DIR / f"{WORKER}.key"
        if not path.exists():
            raise ConfigError(
                f"{d} has no worker host key ({path}); run `pearl keys generate {d}` again: it "
                "adds the missing worker keys and keeps the others"
            )
        worker_public, _ = _load(path, secret=False)
        return cls(api, ClientKeys(api.public, api.secret, worker_public))


@dataclass(frozen=True, slots=True)
class HostKeys:
    """A worker host's keys: to dial pearld, to dial other hosts, and for its own sockets."""

    to_pearld: ClientKeys
    to_peers: ClientKeys  # other hosts' sockets are CURVE servers with the worker key pair
    serve: ServerKeys  # accepts pearld (the server key) and other hosts (the worker key)

    @classmethod
    def load(cls, keydir: str | os.PathLike[str]) -> HostKeys:
        d = Path(keydir)
        path = d / f"{WORKER}.key_secret"
        if not path.exists():
            raise ConfigError(
                f"{d} has no worker host key pair ({path}); run `pearl keys generate {d}` "
                "again: it adds the missing worker keys and keeps the others"
            )
        return cls.of(ClientKeys.load(d, WORKER))

    @classmethod
    def of(cls, mine: ClientKeys) -> HostKeys:
        """From the worker key pair and pearld's public key (``mine``)."""
        peers = ClientKeys(mine.public, mine.secret, mine.public)
        serve = ServerKeys(mine.public, mine.secret, frozenset({mine.public, mine.server_public}))
        return cls(mine, peers, serve)

    def to_text(self) -> dict[str, str]:
        """What a launcher hands a host on another machine (z85 text, no files): the worker key
        pair and pearld's public key; :meth:`of_text` reads it back."""
        k = self.to_pearld
        return {
            "public": k.public.decode(),
            "secret": k.secret.decode(),
            "server": k.server_public.decode(),
        }

    @classmethod
    def of_text(cls, d: dict[str, str]) -> HostKeys:
        try:
            keys = [d[k].encode("ascii") for k in ("public", "secret", "server")]
        except (KeyError, AttributeError, UnicodeEncodeError, TypeError):
            raise ConfigError(
                "worker host keys: expected public, secret and server (z85 text)"
            ) from None
        if any(len(k) != 40 for k in keys):
            raise ConfigError("worker host keys: each key is 40 characters of z85 text")
        return cls.of(ClientKeys(*keys))


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
            "machines. Bind tcp://127.0.0.1:PORT or ipc:// instead, or create keys with "
            "`pearl keys generate DIR` and start pearld with `--set daemon.keys_dir=DIR` "
            "(clients then pass `--keys-dir DIR`)"
        )


def generate(
    keydir: str | os.PathLike[str], clients: tuple[str, ...] | None = None, force: bool = False
) -> list[Path]:
    """Write every key a deployment needs; returns the files written.

    The server's and the worker hosts' key pairs are written unless present, and so is the
    ``client`` key pair when ``clients`` is None; running it again on an older directory adds
    what is missing. Each name in ``clients`` gets a key pair (an existing one is an error unless
    ``force``, which replaces every key it writes); new names are added to the others.
    """
    d = Path(keydir)
    adir = d / AUTHORIZED_DIR

    def present(name: str) -> bool:
        return (d / f"{name}.key_secret").exists() and (adir / f"{name}.key").exists()

    server = [d / "server.key", d / "server.key_secret"]
    make_server = force or not all(p.exists() for p in server)
    targets = server if make_server else []
    names = list(dict.fromkeys(clients or ()))
    names += [n for n in (WORKER, *((CLIENT,) if clients is None else ())) if n not in names]
    names = [n for n in names if force or n in (clients or ()) or not present(n)]
    for name in names:
        if not name or "/" in name or name.startswith(".") or name == "server":
            raise ConfigError(f"client name {name!r}: use a plain file name other than 'server'")
        targets += [d / f"{name}.key_secret", adir / f"{name}.key"]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not force:
        raise ConfigError(f"keys exist already: {', '.join(existing)}; pass --force to replace")
    if not targets:
        raise ConfigError(
            f"{d} holds every key already (server, {WORKER}, {CLIENT}); pass --client NAME to "
            "add a client, or --force to replace them"
        )
    adir.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    if make_server:
        public, secret = zmq.curve_keypair()
        _write(d / "server.key", public, None)
        _write(d / "server.key_secret", public, secret)
    for name in names:
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
        self.auth = _start_authenticator(ctx)

    def callback(self, domain: str, client_key: bytes) -> bool:
        return client_key in self.allowed.get(domain, frozenset())


ZAP_REBIND_S = 2.0  # how long a new authenticator waits for the last one's endpoint to go


def _start_authenticator(ctx: zmq.Context[Any]) -> ThreadAuthenticator:
    """A started ZAP authenticator on ``ctx``. ZeroMQ binds one per context at a fixed inproc
    endpoint, and a stopped one's socket is closed by the context's reaper thread a moment
    later: until then binding a new one fails with EADDRINUSE, so that is waited out."""
    deadline = time.monotonic() + ZAP_REBIND_S
    while True:
        auth = ThreadAuthenticator(ctx)
        try:
            auth.start()
            return auth
        except zmq.ZMQError as e:
            if auth.zap_socket is not None:
                auth.zap_socket.close(linger=0)
            if e.errno != zmq.EADDRINUSE or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)


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
    """Forget a closed server socket's domain. After the last one, a private context's
    authenticator stops (the context can then terminate); the process-wide context's runs on,
    for the next secured socket: a stopped one's inproc endpoint stays bound until the
    sessions that used it are torn down, and a new one could not bind meanwhile (a pearld
    started in-process right after another stopped failed with 'Address already in use')."""
    with _ZAP_LOCK:
        zap = _ZAPS.get(id(ctx))
        if zap is None:
            return
        zap.allowed.pop(domain, None)
        zap.auth.credentials_providers.pop(domain, None)
        if not zap.allowed and ctx is not zmq.Context._instance:
            del _ZAPS[id(ctx)]
            zap.auth.stop()


def secure_client(sock: zmq.Socket[Any], keys: ClientKeys) -> None:
    """Make ``sock`` a CURVE client of the server whose public key is ``keys.server_public``."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = keys.server_public


__all__ = [
    "AUTHORIZED_DIR",
    "CLIENT",
    "WORKER",
    "ClientKeys",
    "DaemonKeys",
    "HostKeys",
    "InsecureBind",
    "ServerKeys",
    "check_bind",
    "generate",
    "is_local",
    "release_server",
    "secure_client",
    "secure_server",
]
