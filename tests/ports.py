"""Loopback ports for servers a test starts, from below the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for bind(0) and outgoing connections."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        lo, hi = text.split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_base(n: int, offset: int = 0) -> int:
    """A port p with p .. p+n and p+offset .. p+offset+n free on loopback, below the
    ephemeral range: a port found free there can still be taken, between this check and the
    server's bind, by any socket bound to port 0 or any outgoing connection (a ZeroMQ channel,
    an HTTP client); ports outside that range are only taken by a bind that names them."""
    lo, _ = ephemeral_range()
    top = lo - offset - n if lo > 12000 else 65000 - offset - n
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10000, top)
        socks: list[socket.socket] = []
        try:
            for p in sorted({*range(base, base + n), *range(base + offset, base + offset + n)}):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")
