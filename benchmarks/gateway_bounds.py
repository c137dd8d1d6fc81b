"""The gateway's bounds around a live pearld (sim engine): slow connections, session ids, and the
session book's per-request cost.

    python benchmarks/gateway_bounds.py slow [--conns 20000]
    python benchmarks/gateway_bounds.py sessions [--sessions 6000] [--id-bytes 256]
    python benchmarks/gateway_bounds.py book

``slow``: ``--conns`` connections that send half a request head and then nothing (from child
processes, each under its own fd limit); pearld's open fds, RSS and log growth while they hang,
and whether ``pearl status`` and an event over ZeroMQ are still answered.
``sessions``: that many requests with distinct session ids of ``--id-bytes`` bytes, then a
``training-begin`` that ends the sessions; pearld's RSS before, after the requests and after the
sessions ended.
``book``: the cost of one request's ``begin`` + ``end`` in the session book with 0, 10k and 50k
open sessions (in process).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pearl.core import events as ev  # noqa: E402
from pearl.testing.pearld import Pearld, free_port  # noqa: E402
from pearl.testing.wait import wait_until  # noqa: E402

PER_CHILD = 6000  # slow connections one child process holds


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def hold(port: int, n: int, seconds: float) -> None:
    """(A child process.) Open ``n`` connections that send half a request head; hold them for
    ``seconds``; print how many connected and how many the server closed."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
        sel.register(s, selectors.EVENT_WRITE)
    connected = 0
    deadline = time.monotonic() + 20
    while connected < n and time.monotonic() < deadline:
        for key, _ in sel.select(0.5):
            sel.unregister(key.fileobj)
            s = key.fileobj  # type: ignore[assignment]
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                try:
                    s.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ")
                    connected += 1
                except OSError:
                    pass
    print(json.dumps({"connected": connected}), flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.5)
    closed = 0
    for s in socks:
        try:
            s.setblocking(False)
            if s.recv(1 << 16) == b"":
                closed += 1
            else:
                closed += 1  # an answer (a refusal), then the close
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    print(json.dumps({"closed_by_server": closed}), flush=True)


def start_pearld(tmp: Path, sets: list[str]) -> tuple[Pearld, int]:
    gport = free_port()
    d = Pearld(
        tmp,
        [
            "engine.sim.time_scale=0.001",
            "daemon.borrow=never",
            f"gateway.listen=127.0.0.1:{gport}",
            "gateway.model=pearl-sim",
            *sets,
        ],
        port=free_port(),
    )
    d.start()
    assert d.proc is not None
    wait_until(
        lambda: any(
            w["activity"] == "active" and w["role"] != "training"
            for w in d.status().get("workers", [])
        ),
        60,
        "a worker serving",
    )
    return d, gport


def answered(d: Pearld, gpus: tuple[int, ...]) -> dict[str, Any]:
    """Whether status and an event over ZeroMQ are answered, and how fast."""
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    try:
        out["status_ok"] = bool(d.status())
    except Exception as e:
        out["status_ok"] = f"no: {e}"
    out["status_s"] = round(time.monotonic() - t0, 3)
    t0 = time.monotonic()
    try:
        out["event_seq"] = d.event(ev.GpusAdded(gpus=gpus))
    except Exception as e:
        out["event_seq"] = f"no: {e}"
    out["event_s"] = round(time.monotonic() - t0, 3)
    return out


def http_status(port: int) -> str:
    import httpx

    try:
        r = httpx.get(f"http://127.0.0.1:{port}/pearl/v1/status", timeout=5)
        return str(r.status_code)
    except Exception as e:
        return type(e).__name__


def slow(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    d, gport = start_pearld(tmp, list(args.set))
    assert d.proc is not None
    pid = d.proc.pid
    out: dict[str, Any] = {"part": "slow", "conns": args.conns, "sets": args.set}
    try:
        http_status(gport)  # warm: the gateway's first request loads what it needs
        out["before"] = {"fds": fds(pid), "rss_mb": round(rss_mb(pid), 1)}
        log0 = d.log_path(d.starts).stat().st_size
        children = []
        left = args.conns
        while left > 0:
            n = min(PER_CHILD, left)
            left -= n
            children.append(
                subprocess.Popen(
                    [sys.executable, __file__, "_hold", str(gport), str(n), str(args.hold_s)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        connected = 0
        for c in children:
            assert c.stdout is not None
            connected += json.loads(c.stdout.readline())["connected"]
        out["connected"] = connected
        peak_fds = fds(pid)
        out["during"] = {
            "fds": peak_fds,
            "rss_mb": round(rss_mb(pid), 1),
            **answered(d, (20, 21)),
            "http_status": http_status(gport),
        }
        closed = 0
        for c in children:
            assert c.stdout is not None
            closed += json.loads(c.stdout.readline())["closed_by_server"]
            c.wait(30)
        out["closed_by_server"] = closed
        out["log_growth_kb"] = round((d.log_path(d.starts).stat().st_size - log0) / 1024, 1)
        wait_until(lambda: fds(pid) <= out["before"]["fds"] + 16, 60, "fds back", every=0.5)
        out["after"] = {
            "fds": fds(pid),
            "rss_mb": round(rss_mb(pid), 1),
            **answered(d, (22, 23)),
            "http_status": http_status(gport),
        }
        out["alive"] = d.running()
    finally:
        d.cleanup()
    return out


def sessions(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import httpx

    d, gport = start_pearld(tmp, list(args.set))
    assert d.proc is not None
    pid = d.proc.pid
    out: dict[str, Any] = {
        "part": "sessions",
        "sessions": args.sessions,
        "id_bytes": args.id_bytes,
        "via": "user" if args.via_user else "X-Session-ID",
    }
    url = f"http://127.0.0.1:{gport}/v1/completions"
    codes: dict[int, int] = {}
    try:
        with httpx.Client(timeout=60) as http:
            for _ in range(3):  # warm: the first requests load what the gateway needs
                http.post(url, json={"model": "pearl-sim", "prompt": [1, 2, 3], "max_tokens": 1})
        out["rss_before_mb"] = round(rss_mb(pid), 1)

        def one(k: int) -> int:
            sid = f"{k:08d}".ljust(args.id_bytes, "x")
            body: dict[str, Any] = {"model": "pearl-sim", "prompt": [1, 2, 3], "max_tokens": 1}
            if args.via_user:  # a header is bounded by uvicorn's head limit (16 KiB)
                r = http.post(url, json={**body, "user": sid})
            else:
                r = http.post(url, json=body, headers={"X-Session-ID": sid})
            return r.status_code

        t0 = time.monotonic()
        with (
            httpx.Client(timeout=120, limits=httpx.Limits(max_connections=32)) as http,
            ThreadPoolExecutor(16) as pool,
        ):
            for code in pool.map(one, range(args.sessions)):
                codes[code] = codes.get(code, 0) + 1
        out["requests_s"] = round(time.monotonic() - t0, 1)
        out["codes"] = codes
        out["rss_after_requests_mb"] = round(rss_mb(pid), 1)
        d.event(ev.TrainingBegin(step=1))  # a step boundary: every idle session ends
        d.event(ev.TrainingFinished(step=1))
        out["rss_after_end_mb"] = round(rss_mb(pid), 1)
        out["growth_after_end_mb"] = round(out["rss_after_end_mb"] - out["rss_before_mb"], 1)
    finally:
        d.cleanup()
    return out


def book(_: argparse.Namespace, __: Path) -> dict[str, Any]:
    import threading

    from pearl.gateway.sessions import SessionBook

    out: dict[str, Any] = {"part": "book", "us_per_request": {}}
    for n in (0, 10_000, 50_000):
        b = SessionBook(per_step=8, idle_s=3600.0)
        lock = threading.Lock()
        b.expire = lambda now=None: None  # type: ignore[method-assign]  # setup only
        for k in range(n):  # open sessions: answered, idle, not yet expired
            key = b.begin(f"open-{k}", 10)
            b.end(key, 10, 1)
        del b.expire
        reps = 500
        t0 = time.perf_counter()
        for k in range(reps):
            with lock:
                key = b.begin(f"s-{k % 64}", 10)
            with lock:
                b.end(key, 10, 1)
        out["us_per_request"][n] = round((time.perf_counter() - t0) / reps * 1e6, 1)
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_hold":
        hold(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=["slow", "sessions", "book"])
    ap.add_argument("--conns", type=int, default=20_000)
    ap.add_argument("--hold-s", type=float, default=15.0)
    ap.add_argument("--sessions", type=int, default=6000)
    ap.add_argument("--id-bytes", type=int, default=256)
    ap.add_argument("--via-user", action="store_true", help="the id as `user`, not the header")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = ap.parse_args()
    part = {"slow": slow, "sessions": sessions, "book": book}[args.part]
    with tempfile.TemporaryDirectory(prefix="pearl-bounds-") as tmp:
        print(json.dumps(part(args, Path(tmp)), indent=1))


if __name__ == "__main__":
    main()
