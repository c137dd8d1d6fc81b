"""pearld's start, timed: from ``python -m pearl.daemon`` to the gateway's ``/v1/models`` answered.

    python scripts/pearld_start.py [--config configs/sim-32.toml] [--runs 1] [--set K=V]

Each run starts pearld on a fresh state directory with the gateway on a free loopback port and
its API on an ``ipc://`` socket, polls ``GET /v1/models`` every 10 ms until it answers 200, then
reads ``/proc/PID/maps`` to say whether pearld's process loaded torch (``libtorch``), and
stops pearld with SIGTERM. Prints one line per run, then the median (``--json``: the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loaded(pid: int, lib: str) -> bool:
    """Whether process ``pid`` has mapped a shared library whose name contains ``lib``."""
    try:
        return lib in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def one_run(config: str, sets: list[str], timeout_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="pearld-start-") as tmp:
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "pearl.daemon",
            "--config",
            config,
            "--state-dir",
            f"{tmp}/state",
            "--endpoint",
            f"ipc://{tmp}/api.sock",
            "--set",
            f"gateway.listen=127.0.0.1:{port}",
            *[a for s in sets for a in ("--set", s)],
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            while True:
                if proc.poll() is not None:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise SystemExit(f"pearld exited ({proc.returncode}):\n{err[-2000:]}")
                if time.perf_counter() - t0 > timeout_s:
                    raise SystemExit(f"/v1/models did not answer in {timeout_s:g} s")
                try:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/v1/models", timeout=1.0
                    ) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
                time.sleep(0.01)
            took = time.perf_counter() - t0
            return {"seconds": round(took, 3), "torch": loaded(proc.pid, "libtorch")}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/sim-32.toml")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", action="store_true", help="print the runs as JSON")
    a = p.parse_args(argv)
    runs = []
    for i in range(a.runs):
        r = one_run(a.config, a.set, a.timeout)
        runs.append(r)
        if not a.json:
            print(f"run {i + 1}: {r['seconds']:.2f} s to /v1/models, torch in pearld {r['torch']}")
    if a.json:
        print(json.dumps(runs))
    else:
        print(
            f"median of {len(runs)}: {statistics.median(float(r['seconds']) for r in runs):.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
