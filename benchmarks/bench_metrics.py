"""Scraping pearld's /metrics does not slow its control path.

One pearld (sim engines, 32 reserved workers, metrics on) takes alternating ``gpus-added`` /
``gpus-reclaimed`` events, each answered by a plan. Rounds alternate: no scraper, then a scraper
reading ``/metrics`` at 10 Hz from a thread of this process. Compared: the median time from
sending an event to its acknowledgement (the controller ran and the records, plan included, are
durable) and pearld's own ``pearl_event_to_plan_seconds`` (mean over the round). Target: with the
scraper within 10% of without.

    .venv/bin/python benchmarks/bench_metrics.py [--events 200] [--rounds 4] [--hz 10]  (~9 min)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_pearld import free_port, pearld, small_sets, stop, wait_status  # noqa: E402
from pearl.core import events as ev  # noqa: E402
from transports.protocol import Event, StatusRequest  # noqa: E402
from transports.rpc import Client  # noqa: E402


def histogram(url: str, name: str) -> tuple[float, float]:
    """(sum, count) of a histogram in one scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    fam = next(f for f in text_string_to_metric_families(text) if f.name == name)
    by = {s.name: s.value for s in fam.samples if not s.labels.get("le")}
    return by[f"{name}_sum"], by[f"{name}_count"]


def settle(c: Client, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = c.request(StatusRequest()).payload
        if s is not None and s.plan is None and not s.transitions:
            return
        time.sleep(0.005)
    raise RuntimeError("pearld did not settle")


def one_round(c: Client, url: str, events: int, hz: float) -> dict[str, float]:
    stop_scraper = threading.Event()
    scrapes = [0]

    def scraper() -> None:
        while not stop_scraper.wait(1.0 / hz):
            with urllib.request.urlopen(url, timeout=5) as r:
                r.read()
            scrapes[0] += 1

    t = threading.Thread(target=scraper, daemon=True)
    if hz:
        t.start()
    s0, n0 = histogram(url, "pearl_event_to_plan_seconds")
    acks = []
    try:
        for i in range(events):
            record = ev.GpusAdded(gpus=(64, 65)) if i % 2 == 0 else ev.GpusReclaimed(gpus=(64, 65))
            t0 = time.perf_counter()
            c.request(Event.of(record), 5.0)
            acks.append(time.perf_counter() - t0)
            settle(c)
    finally:
        stop_scraper.set()
        if hz:
            t.join(5)
    s1, n1 = histogram(url, "pearl_event_to_plan_seconds")
    return {
        "ack_median_s": statistics.median(acks),
        "event_to_plan_mean_s": (s1 - s0) / max(n1 - n0, 1),
        "scrapes": float(scrapes[0]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=4, help="rounds of each (alternating)")
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--json", help="write the figures as JSON to this file")
    ap.add_argument(
        "--small", action="store_true", help="20 events, one round of each (a smoke run)"
    )
    a = ap.parse_args()
    if a.small:
        a.events, a.rounds = 20, 1
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with tempfile.TemporaryDirectory(prefix="bench_metrics-") as tmp:
        endpoint = f"ipc://{tmp}/api.sock"
        sets = [*small_sets(32), f"daemon.metrics=127.0.0.1:{port}"]
        proc = pearld(Path(tmp) / "state", endpoint, sets)
        try:
            wait_status(endpoint)
            with Client(endpoint, timeout_s=5.0) as c:
                settle(c, 120.0)
                one_round(c=c, url=url, events=20, hz=0)  # warm-up
                res: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
                for r in range(2 * a.rounds):
                    key = "on" if r % 2 else "off"
                    res[key].append(
                        one_round(c=c, url=url, events=a.events, hz=a.hz if key == "on" else 0)
                    )
        finally:
            stop(proc)
    out = {}
    for key in ("off", "on"):
        out[f"ack_median_s_{key}"] = statistics.median(x["ack_median_s"] for x in res[key])
        out[f"event_to_plan_mean_s_{key}"] = statistics.median(
            x["event_to_plan_mean_s"] for x in res[key]
        )
    out["ack_ratio"] = out["ack_median_s_on"] / out["ack_median_s_off"]
    out["event_to_plan_ratio"] = out["event_to_plan_mean_s_on"] / out["event_to_plan_mean_s_off"]
    out["scrapes_per_round"] = statistics.median(x["scrapes"] for x in res["on"])
    print(
        f"event -> ack, median: {out['ack_median_s_off'] * 1e3:.2f} ms without a scraper, "
        f"{out['ack_median_s_on'] * 1e3:.2f} ms with one at {a.hz:g} Hz "
        f"({out['ack_ratio']:.2f}x); pearld's event -> plan, mean: "
        f"{out['event_to_plan_mean_s_off'] * 1e3:.2f} / {out['event_to_plan_mean_s_on'] * 1e3:.2f} "
        f"ms ({out['event_to_plan_ratio']:.2f}x); {int(out['scrapes_per_round'])} scrapes a round "
        f"of {a.events} events; target <= 1.10x"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
