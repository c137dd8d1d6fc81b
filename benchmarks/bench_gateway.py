"""K concurrent multi-turn agent sessions through PEARL's HTTP gateway, on sim engines.

    python benchmarks/bench_gateway.py [--sessions 32] [--turns 4] [--tokens 32] [--rounds 3]
                                       [--json FILE] [--small]

The same agents (token-id prompts that grow by each reply and an observation, an environment
delay between turns, one session id each) run two ways against one pearld's pool, in alternate
rounds: through the gateway over HTTP (``/v1/completions`` with ``X-Session-ID``), and through
the gateway's own backend in the agents' process (the same Router and workers, no HTTP). The
ratio of their token rates and the difference of their latency percentiles are what the HTTP
gateway adds. A last round through the gateway is a storm: preemptible GPUs join and are
reclaimed with turns in flight, and a training step lends and returns the training GPUs; it
counts failed requests and the prompt tokens that had to be prefilled again.

Not measured here: the agents calling the workers directly, and the same workers behind a real
router (``vllm-router`` / ``sglang-router``): sim workers speak only to pearld.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pearl  # noqa: E402
from actors import names  # noqa: E402
from pearl.gateway.backend import Sampling  # noqa: E402
from pearl.gateway.pool import PoolBackend  # noqa: E402
from pearl.runtime import wait_training_may_proceed  # noqa: E402
from pearl.testing.wait import wait_until  # noqa: E402

SETS = (
    "engine.kind=sim",
    "engine.time_scale=0.05",
    "engine.sim_start_s=1",
    "rl.env=",  # gateway-only traffic
    "daemon.pd=colocated",
    "daemon.tick_s=0.1",
    "daemon.heartbeat_s=0.5",
    "workload.max_trajectory_tokens=8192",
    "gateway.listen=127.0.0.1:0",
)

Reply = tuple[list[int], dict[str, Any]]  # the generated ids, the usage
Turn = Callable[[str, list[int], int], Awaitable[Reply]]


@dataclass
class Tally:
    tokens: int = 0
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    recomputed: int = 0
    migrations: int = 0
    errors: list[str] = field(default_factory=list)


async def agents(
    turn: Turn, a: argparse.Namespace, tag: str, tally: Tally, until: threading.Event | None = None
) -> float:
    """Every session's turns, all sessions at once (again and again until ``until`` is set,
    when given); the seconds the round took."""

    async def session(i: int) -> None:
        n = 0
        while True:
            await one(i, f"{tag}-{i}.{n}")
            n += 1
            if until is None or until.is_set() or tally.failed:
                return

    async def one(i: int, sid: str) -> None:
        rng = random.Random(sid)
        prompt = [rng.randrange(256) for _ in range(a.prompt)]
        for _ in range(a.turns):
            t0 = time.perf_counter()
            try:
                ids, usage = await turn(sid, prompt, a.tokens)
            except Exception as e:  # noqa: BLE001 - a failed request is a figure
                tally.failed += 1
                tally.errors.append(f"{sid}: {type(e).__name__}: {e}"[:300])
                return
            tally.latencies.append(time.perf_counter() - t0)
            tally.tokens += len(ids)
            tally.recomputed += int(usage.get("recomputed_tokens", 0))
            tally.migrations += int(usage.get("migrations", 0))
            await asyncio.sleep(rng.uniform(0.005, 0.02))  # the environment's turn
            prompt = [*prompt, *ids, *(rng.randrange(256) for _ in range(a.obs))]

    t0 = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(a.sessions)))
    return time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--obs", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--small", action="store_true", help="8 sessions x 2 turns, one round")
    a = ap.parse_args()
    if a.small:
        a.sessions, a.turns, a.rounds = 8, 2, 1

    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / "local-cpu.toml", state_dir=work / "state", overrides=SETS
    )
    rt.start()
    try:
        url = rt.gateway_url
        assert url is not None

        def serving() -> bool:
            return any(w.activity == "active" and w.role != "training" for w in rt.status().workers)

        wait_until(serving, 60, "a worker serving", every=0.1)
        # in-process: the same Router, under a name of its own (the gateway's client keeps its)
        backend = PoolBackend(rt.daemon.directory, rt.cfg, name="bench-inprocess")
        model = rt.daemon.gateway_backend.model
        print(f"bench_gateway: {a.sessions} sessions x {a.turns} turns x {a.tokens} tokens, "
              f"{len(rt.status().workers) - 1} sim workers", flush=True)  # fmt: skip

        async def inprocess(
            sid: str, prompt: list[int], n: int
        ) -> tuple[list[int], dict[str, Any]]:
            ids: list[int] = []
            usage = {"recomputed_tokens": 0, "migrations": 0}
            rid = f"b{time.perf_counter_ns()}-{sid}"
            async for d in backend.generate(rid, prompt, Sampling(n, temperature=0.0), sid):
                ids += d.token_ids
                usage["recomputed_tokens"] += d.recomputed_tokens
                usage["migrations"] += d.migrations
            return ids, usage

        async def run_gateway(tag: str, tally: Tally, during: Any = None) -> float:
            limits = httpx.Limits(max_connections=a.sessions + 4)
            async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:

                async def through(
                    sid: str, prompt: list[int], n: int
                ) -> tuple[list[int], dict[str, Any]]:
                    r = await http.post(
                        "/completions",
                        json={"model": model, "prompt": prompt, "max_tokens": n,
                              "temperature": 0, "return_token_ids": True},
                        headers={"X-Session-ID": sid},
                    )  # fmt: skip
                    if r.status_code != 200:
                        raise RuntimeError(f"{r.status_code} {r.text[:200]}")
                    body = r.json()
                    return body["choices"][0]["token_ids"], body["usage"]

                if during is None:
                    return await agents(through, a, tag, tally)
                done = threading.Event()
                task = asyncio.create_task(agents(through, a, tag, tally, until=done))
                try:
                    await asyncio.to_thread(during)
                finally:
                    done.set()
                return await task

        rates: dict[str, list[float]] = {"gateway": [], "inprocess": []}
        lat: dict[str, list[float]] = {"gateway": [], "inprocess": []}
        for r in range(a.rounds):
            order = ["inprocess", "gateway"] if r % 2 == 0 else ["gateway", "inprocess"]
            for way in order:
                tally = Tally()
                if way == "gateway":
                    secs = asyncio.run(run_gateway(f"g{r}", tally))
                else:
                    secs = asyncio.run(agents(inprocess, a, f"i{r}", tally))
                if tally.failed:
                    print(f"  {way}: {tally.failed} failed: {tally.errors[:3]}", flush=True)
                rates[way].append(tally.tokens / secs)
                lat[way] += tally.latencies
                print(f"  round {r + 1}: {way:9s} {tally.tokens / secs:8.1f} tok/s, p50 "
                      f"{pct(tally.latencies, 0.5) * 1e3:.1f} ms", flush=True)  # fmt: skip
        sessions = rt.daemon.gateway_backend.sessions
        homes = [s.workers for s in sessions.open.values() if len(s.workers) > 1]
        hits = sum(w == s[0] for s in homes for w in s[1:])
        turns_after_first = sum(len(s) - 1 for s in homes)

        # the storm: joins and a reclaim with turns in flight, and a borrow cycle
        router = rt.daemon.directory.get(names.ROUTER).ref.proxy()

        def storm() -> None:
            for cycle in range(1, 3):
                rt.event(pearl.core.events.GpusAdded((3, 4)))

                def joined() -> bool:
                    on = [w for w in rt.status().workers if set(w.gpus) & {3, 4}]
                    return sum(w.activity == "active" for w in on) == 2

                wait_until(joined, 60, "the joiners serving")

                def busy() -> bool:
                    on = {w for p in router.pending.get().values() for w in p.workers}
                    return any(set(w.gpus) & {3, 4} and w.id in on for w in rt.status().workers)

                wait_until(busy, 60, "turns on a joiner", every=0.005)
                rt.event(pearl.core.events.GpusReclaimed((3, 4)))
                step = rt.status().training_step + 1
                rt.event(pearl.core.events.TrainingBegin(step))
                wait_training_may_proceed(rt.status, step, timeout_s=60)
                rt.event(pearl.core.events.TrainingFinished(step))
                print(f"  storm cycle {cycle}: a reclaim with turns in flight, a borrow cycle",
                      flush=True)  # fmt: skip

        storm_tally = Tally()
        asyncio.run(run_gateway("storm", storm_tally, during=storm))
        backend.close()
    finally:
        rt.stop()

    gw, ip = statistics.median(rates["gateway"]), statistics.median(rates["inprocess"])
    out = {
        "sessions": a.sessions,
        "gateway_tok_s": gw,
        "inprocess_tok_s": ip,
        "ratio_inprocess": gw / ip,
        "p50_added_ms": (pct(lat["gateway"], 0.5) - pct(lat["inprocess"], 0.5)) * 1e3,
        "p99_added_ms": (pct(lat["gateway"], 0.99) - pct(lat["inprocess"], 0.99)) * 1e3,
        "failed_requests": storm_tally.failed,
        "recomputed_tokens": storm_tally.recomputed,
        "migrations": storm_tally.migrations,
        "affinity_hit_ratio": hits / turns_after_first if turns_after_first else None,
        # not measured (see the module docstring): no direct or real-router baseline on sim
        "direct_tok_s": None,
        "router_tok_s": None,
        "ratio_direct": None,
        "ratio_router": None,
        "router_failed_requests": None,
    }
    print(f"gateway / in-process: {out['ratio_inprocess']:.3f}x ({gw:.0f} / {ip:.0f} tok/s, "
          f"medians of {a.rounds}); added latency p50 {out['p50_added_ms']:.2f} ms, p99 "
          f"{out['p99_added_ms']:.2f} ms; storm: {storm_tally.failed} failed, "
          f"{storm_tally.migrations} migrated, {storm_tally.recomputed} tokens recomputed; "
          f"affinity {out['affinity_hit_ratio']}")  # fmt: skip
    if storm_tally.errors:
        print("  failures:", *storm_tally.errors[:5], sep="\n    ")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0 if storm_tally.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
