"""Worker hosts through Ray vs local subprocesses, in the same run (sim engine).

1. Launch: pearld starts with 8 rollout workers; time from ``start()`` until all 8 serve, with
   ``daemon.launcher = "local"`` (subprocesses here) and ``"ray"`` (detached actors on a simulated
   two-node ``ray.cluster_utils.Cluster``, 4 fake GPUs each, each host pinned to its GPUs' node).
2. Event -> plan -> workers serving: 4 workers serve; a ``gpus-added`` of 4 more (the other node
   on Ray) is sent; time from the event until all 8 serve.

Each figure is the median of ``--repeat`` runs; the ratios are Ray / local. The Ray cluster's own
start (head + 2 nodes) is printed but not counted: a real cluster is up before pearld.

    .venv/bin/python benchmarks/bench_ray.py [--repeat N]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pearl  # noqa: E402
from pearl.core import events as ev  # noqa: E402

CONFIG = ROOT / "configs" / "sim-32.toml"
BASE = [
    "cluster.tp=1",
    "cluster.training_gpus=12-15",
    "engine.kind=sim",
    "engine.sim.time_scale=0.001",
    "daemon.borrow=never",
    "daemon.pd=colocated",
    "daemon.heartbeat_s=0.5",
    "daemon.tick_s=0.05",
    "ray.namespace=pearl-bench",
    "ray.poll_s=0.2",
]


def serving(rt: Any) -> int:
    s = rt.status()
    ok = not s.transitions and s.plan is None
    return ok * sum(w.activity == "active" and w.role != "training" for w in s.workers)


def wait_serving(rt: Any, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while serving(rt) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {n} workers: {rt.status().workers}")
        time.sleep(0.01)


def launch_s(sets: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        rt = pearl.Runtime.from_config(
            CONFIG,
            state_dir=Path(tmp) / "state",
            overrides=[*sets, "cluster.reserved_gpus=0-7", "cluster.preemptible_gpus=8-11"],
        )
        t0 = time.monotonic()
        try:
            rt.start()
            wait_serving(rt, 8)
            return time.monotonic() - t0
        finally:
            rt.stop()


def event_s(sets: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        rt = pearl.Runtime.from_config(
            CONFIG,
            state_dir=Path(tmp) / "state",
            overrides=[*sets, "cluster.reserved_gpus=0-3", "cluster.preemptible_gpus=4-7"],
        )
        try:
            rt.start()
            wait_serving(rt, 4)
            t0 = time.monotonic()
            rt.event(ev.GpusAdded(gpus=(4, 5, 6, 7)))
            wait_serving(rt, 8)
            return time.monotonic() - t0
        finally:
            rt.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--small", action="store_true", help="one repeat (a smoke run)")
    args = p.parse_args()
    if args.small:
        args.repeat = 1
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        print("Ray is not installed: pip install -e '.[ray]'")
        return 1
    t0 = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for label in ("0-3", "4-7"):
            cluster.add_node(num_cpus=1, num_gpus=4, labels={"pearl-gpus": label})
        ray.init(
            address=cluster.address,
            namespace="pearl-bench",
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
        print(f"Ray cluster (head + 2 nodes x 4 fake GPUs) up in {time.monotonic() - t0:.1f}s")
        local = [*BASE, "daemon.launcher=local"]
        on_ray = [*BASE, "daemon.launcher=ray", f"ray.address={cluster.address}"]
        rows = []
        cases = (("launch 8 worker hosts", launch_s), ("gpus-added -> 8 serving", event_s))
        for what, run in cases:
            times = {name: [] for name in ("local", "ray")}
            for _ in range(args.repeat):  # interleaved: both see the same machine load
                times["local"].append(run(local))
                times["ray"].append(run(on_ray))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append((what, med["local"], med["ray"]))
        print(f"{'':26} {'local':>9} {'ray':>9} {'ray/local':>10}   (median of {args.repeat})")
        for what, lo, ry in rows:
            print(f"{what:26} {lo:8.2f}s {ry:8.2f}s {ry / lo:9.2f}x")
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
