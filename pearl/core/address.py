"""Listening addresses: which are local, and the rule for binding beyond loopback.

A socket that listens beyond loopback needs the operator's explicit yes: CURVE keys for the API
(:mod:`transports.auth`), ``daemon.metrics_public`` for the metrics port, which has no
authentication. Checked where the config is loaded, and again where the socket binds.
"""

from __future__ import annotations

import ipaddress

from pearl.core.errors import ConfigError, InsecureBind


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


WILDCARDS = ("*", "0.0.0.0", "[::]", "::")


def advertised(address: str, here: str) -> str:
    """A bound ``tcp://HOST:PORT`` as another machine dials it: a wildcard host (bound on every
    interface) becomes ``here``, this machine's address; any other address is itself."""
    scheme, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme == "tcp" and host in WILDCARDS:
        return f"tcp://{here}:{port}"
    return address


def parse_address(value: str, where: str = "daemon.metrics") -> tuple[str, int]:
    """``HOST:PORT`` (port 0: any free port) -> (host, port); a clear error otherwise."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"{where} = {value!r}: expected HOST:PORT (e.g. 127.0.0.1:9440; port 0 picks a free "
            'one), or "" to turn it off'
        )
    return host, int(port)


def check_exposure(value: str, public: bool, where: str = "daemon.metrics") -> None:
    """The API's bind rule for the metrics port: loopback only, unless ``public`` says otherwise
    (``daemon.metrics_public``); HTTP has no CURVE, so the flag is the operator's explicit yes."""
    if public or is_local(f"tcp://{value}"):
        return
    raise InsecureBind(
        f"refusing to serve {where} on {value}: it may be reachable from other machines and "
        "has no authentication. Bind 127.0.0.1:PORT instead, or expose it on purpose with "
        "`--set daemon.metrics_public=true` (behind a firewall that lets only Prometheus in)"
    )


__all__ = ["check_exposure", "is_local", "parse_address"]
