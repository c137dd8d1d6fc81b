"""Round-trip latency: transports.rpc Client/Server vs a bare ZeroMQ ROUTER/DEALER echo.

Both run in this process over the same endpoint kind (TCP loopback by default), with the server on
its own thread, so the ratio isolates what the codec, envelope checks, dispatch and Lazy Pirate
bookkeeping add. Target: rpc median <= 3x the bare echo median.

    .venv/bin/python benchmarks/bench_transport.py [--n 15000] [--ipc]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transports.protocol import Ping, Pong, Status, StatusRequest  # noqa: E402
from transports.rpc import Client, Server, dispatch  # noqa: E402


class BareEcho:
    """ROUTER echo thread + DEALER client: the floor any ZeroMQ request/reply pays."""

    def __init__(self, ctx: zmq.Context[Any], address: str) -> None:
        self.router = ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.bind(address)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.dealer = ctx.socket(zmq.DEALER)
        self.dealer.linger = 0
        self.dealer.connect(self.router.get_string(zmq.LAST_ENDPOINT))

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stop.is_set():
            if poller.poll(100):
                self.router.send_multipart(self.router.recv_multipart())

    def run(self, n: int, payload: bytes) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.dealer.send(payload)
            self.dealer.poll(2000)
            self.dealer.recv()
            out.append(time.perf_counter() - t0)
        return out

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.dealer.close()
        self.router.close()


class Rpc:
    """The same round trip through transports.rpc (encode, checks, dispatch, correlation)."""

    def __init__(self, ctx: zmq.Context[Any], address: str) -> None:
        handler = dispatch(
            {Ping: lambda env: Pong(nonce=env.msg.nonce), StatusRequest: lambda env: Status()}
        )
        self.server = Server(address, handler, ctx=ctx)
        self.client = Client(self.server.address, ctx=ctx)

    def run(self, n: int, msg: Any) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.client.request(msg)
            out.append(time.perf_counter() - t0)
        return out

    def close(self) -> None:
        self.client.close()
        self.server.close()


def summary(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1e6, xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=15000, help="round trips per variant")
    ap.add_argument("--ipc", action="store_true", help="ipc:// instead of tcp://127.0.0.1")
    ap.add_argument(
        "--small", action="store_true", help="500 round trips per variant (a smoke run)"
    )
    args = ap.parse_args()
    if args.small:
        args.n = 500
    ctx: zmq.Context[Any] = zmq.Context()
    tmp = tempfile.TemporaryDirectory()
    k = iter(range(1000))

    def addr() -> str:
        return f"ipc://{tmp.name}/b{next(k)}" if args.ipc else "tcp://127.0.0.1:*"

    bare_payload = b"\x00" * 90  # about the size of an encoded ping envelope
    res: dict[str, list[float]] = {"bare": [], "ping": [], "status": []}
    bare, rpc = BareEcho(ctx, addr()), Rpc(ctx, addr())
    try:
        bare.run(500, bare_payload)  # warm up
        rpc.run(500, Ping(nonce=1))
        # Both endpoints stay up; alternate small blocks so that load from other processes on a
        # shared machine hits every variant alike.
        block = 250
        for _ in range(max(1, args.n // block)):
            res["bare"] += bare.run(block, bare_payload)
            res["ping"] += rpc.run(block, Ping(nonce=1))
            res["status"] += rpc.run(block, StatusRequest())
    finally:
        bare.close()
        rpc.close()
        ctx.term()
        tmp.cleanup()
    bare_med, bare_p99 = summary(res["bare"])
    print(
        f"transport round trip ({'ipc' if args.ipc else 'tcp loopback'}, "
        f"{len(res['bare'])} each, interleaved in blocks of {block})"
    )
    print(f"{'variant':<22}{'median us':>10}{'p99 us':>10}{'x bare med':>12}{'x bare p99':>12}")
    worst = 0.0
    for name, label in (
        ("bare", "bare ROUTER/DEALER"),
        ("ping", "rpc ping/pong"),
        ("status", "rpc status (dict)"),
    ):
        med, p99 = summary(res[name])
        ratio = med / bare_med
        if name != "bare":
            worst = max(worst, ratio)
        print(f"{label:<22}{med:>10.1f}{p99:>10.1f}{ratio:>12.2f}{p99 / bare_p99:>12.2f}")
    verdict = "OK" if worst <= 3.0 else "OVER TARGET"
    print(f"target: rpc median <= 3.00x bare echo median: worst {worst:.2f}x  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
