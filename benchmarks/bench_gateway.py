"""K concurrent multi-turn agent sessions through PEARL's HTTP gateway, directly to the workers,
through a real router (``sglang-router``) and through a bare pass-through proxy, on the same
workers.

    python benchmarks/bench_gateway.py [--engine sim|torch] [--sessions 64] [--turns 4]
                                       [--tokens 32] [--rounds 3] [--storm-cycles 2]
                                       [--client shared|per-session] [--profile DIR]
                                       [--json FILE] [--small]

One pearld (the embedded Runtime) runs its rollout workers as SGLang-dialect servers: PEARL's
facade (``pearl.engines.facade``) over the sim engine's cost model (``--engine sim``) or the
tiny torch model (``--engine torch``). The same agents (token-id prompts that grow by each reply
and an observation, an environment delay between turns, one session id each), in a process of
their own, post SGLang's ``/generate`` five ways, in alternating rounds:

- ``gateway``: to pearld's gateway, with ``X-Session-ID``;
- ``direct``: to the worker servers themselves, each session pinned to one by its id (client-side
  affinity over the workers that serve at that moment);
- ``router``: to one ``sglang-router`` (cache-aware policy) whose worker list a thread keeps
  equal to the workers that serve (the best an operator could do: it learns of each change
  from pearld's status within 50 ms);
- ``proxy``: through a bare pass-through reverse proxy (``benchmarks/passthrough.py``, a
  process of its own on the gateway's HTTP stack) that takes the workers that serve in turn:
  the floor any extra hop pays;
- ``pinned``: through the same proxy placing each session by its id's hash, as ``direct`` does:
  a hop and nothing else.

The ratios of their token rates and the differences of their latency percentiles are what the
gateway adds. Then each way meets a storm of its own, twice: two preemptible GPUs join, are
reclaimed with turns running on them, and a training step lends and returns the training GPUs.
A request that fails or comes back aborted counts as failed; the gateway also reports the prompt
tokens it had to prefill again after moving a request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pearl  # noqa: E402
from benchmarks.passthrough import Serving  # noqa: E402
from pearl.core import events as ev  # noqa: E402
from pearl.engines.base import EngineError  # noqa: E402
from pearl.engines.sglang.launch import FACADE_MODULE  # noqa: E402
from pearl.engines.sglang.router import SGLangRouterClient, WorkerEndpoint, launch_router  # noqa: E402
from pearl.engines.web import call, parse_metrics  # noqa: E402
from pearl.runtime import wait_training_may_proceed  # noqa: E402
from pearl.testing.pearld import free_port  # noqa: E402
from pearl.testing.wait import poll, wait_until  # noqa: E402

WAYS = ("gateway", "direct", "router", "proxy", "pinned")
PROXIES = {"proxy": [], "pinned": ["--pinned"]}  # benchmarks/passthrough.py's flags per way
JOINERS = (3, 4)  # preemptible GPUs of configs/local-cpu.toml


def settings(engine: str, port: int) -> list[str]:
    sim = engine == "sim"
    return [
        "engine.kind=sglang",
        f"engine.sglang.module={FACADE_MODULE}",
        f"engine.sglang.model_path={'sim' if sim else 'tiny'}",
        f"engine.sglang.port={port}",
        f"engine.sglang.bootstrap_port={port + 100}",
        "engine.sglang.startup_timeout_s=120",
        *(["engine.sglang.extra_args=--sim-time-scale 0.05 --sim-start-s 1"] if sim else []),
        "rl.env=",  # gateway-only traffic
        "daemon.pd=colocated",
        "daemon.tick_s=0.1",
        "daemon.heartbeat_s=0.5",
        "workload.max_trajectory_tokens=8192",
        "gateway.listen=127.0.0.1:0",
        "gateway.max_streams=1024",
    ]


@dataclass
class Tally:
    tokens: int = 0
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    recomputed: int = 0
    migrations: int = 0
    errors: list[str] = field(default_factory=list)


class Pool:
    """The worker servers that serve now (URLs, by worker id), refreshed from pearld's status
    and written to ``path`` for the agents' process; keeps the real router's worker list equal
    to them."""

    def __init__(self, rt: pearl.Runtime, router: str, path: Path) -> None:
        self.rt, self.router, self.path = rt, SGLangRouterClient(router), path
        self.base = rt.cfg.engine.sglang.port
        self.urls: dict[int, str] = {}
        self.registered: dict[str, str] = {}  # url -> the router's id for it
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # While the agents go through the gateway, nothing polls pearld's status from its
        # process (this one): the gateway shares it, and direct and router agents need the URLs.
        self.paused = False
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="bench-pool", daemon=True)
        self._thread.start()

    def refresh(self) -> None:
        with self._lock:
            urls = {
                w.id: f"http://127.0.0.1:{self.base + min(w.gpus)}"
                for w in self.rt.status().workers
                if w.role != "training" and w.activity == "active"
            }
            if urls != self.urls:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(sorted(urls.items())))
                os.replace(tmp, self.path)
            self.urls = urls
            want = set(urls.values())
            for url in sorted(set(self.registered) - want):
                self.router.remove(self.registered.pop(url))
            for wid, url in sorted(urls.items()):
                if url not in self.registered:
                    self.registered[url] = self.router.add(WorkerEndpoint(wid, url, "regular"))

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            if self.paused:
                continue
            try:
                self.refresh()
            except Exception as e:  # noqa: BLE001 - pearld busy or a router call failed: again
                print(f"  pool refresh: {type(e).__name__}: {e}", flush=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


async def agents(
    post: Callable[[str, dict[str, Any]], Any],
    a: argparse.Namespace,
    tag: str,
    tally: Tally,
    until: Any = None,
) -> float:
    """Every session's turns, all sessions at once (again and again until ``until`` is set,
    when given); the seconds the round took."""

    async def session(i: int) -> None:
        n = 0
        while True:
            await one(f"{tag}-{i}.{n}")
            n += 1
            if until is None or until.is_set():
                return

    async def one(sid: str) -> None:
        rng = random.Random(sid)
        prompt = [rng.randrange(256) for _ in range(a.prompt)]
        for _ in range(a.turns):
            body = {
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": a.tokens, "temperature": 0.0},
            }
            t0 = time.perf_counter()
            try:
                out = await post(sid, body)
                why = (out["meta_info"].get("finish_reason") or {}).get("type")
                if why not in ("length", "stop"):
                    raise RuntimeError(f"finished {out['meta_info'].get('finish_reason')}")
            except Exception as e:  # noqa: BLE001 - a failed request is a figure
                tally.failed += 1
                tally.errors.append(f"{sid}: {type(e).__name__}: {e}"[:300])
                return
            tally.latencies.append(time.perf_counter() - t0)
            ids = out["output_ids"]
            tally.tokens += len(ids)
            tally.recomputed += int(out["meta_info"].get("recomputed_tokens", 0))
            tally.migrations += int(out["meta_info"].get("migrations", 0))
            await asyncio.sleep(rng.uniform(0.005, 0.02))  # the environment's turn
            prompt = [*prompt, *ids, *(rng.randrange(256) for _ in range(a.obs))]

    t0 = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(a.sessions)))
    return time.perf_counter() - t0


async def run_way(
    way: str,
    a: argparse.Namespace,
    tag: str,
    tally: Tally,
    urls: dict[str, str],
    picker: Serving,
    until: Any = None,
) -> float:
    """One round of ``way``'s agents. ``a.client``: ``shared``, one httpx client (and connection
    pool) for all sessions; ``per-session``, one for each session, as separate agents have: a
    shared pool scans every idle keep-alive connection on each request (httpcore's
    ``_assign_requests_to_connections``), a cost the servers that close connections (the
    workers, HTTP/1.0: ``direct``) never see."""
    # One TLS context for all clients: httpx builds one per client (loading the CA bundle, ms of
    # CPU) even for plain HTTP, a cost per session that no request should carry.
    tls = ssl.create_default_context()
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str, httpx.AsyncClient] = {}

        def client_of(sid: str) -> httpx.AsyncClient:
            key = sid.rsplit(".", 1)[0] if a.client == "per-session" else ""
            if key not in clients:
                n = 2 if key else a.sessions + 8
                limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
                clients[key] = httpx.AsyncClient(timeout=300, limits=limits, verify=tls)
                stack.push_async_callback(clients[key].aclose)
            return clients[key]

        async def post(sid: str, body: dict[str, Any]) -> Any:
            base = picker.pick(sid) if way == "direct" else urls[way]
            r = await client_of(sid).post(
                base + "/generate", json=body, headers={"X-Session-ID": sid}
            )
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code} {r.text[:200]}")
            return r.json()

        return await agents(post=post, a=a, tag=tag, tally=tally, until=until)


def agents_process(
    way: str, a: dict[str, Any], tag: str, urls: dict[str, str], pool_file: str, until: Any
) -> tuple[float, Tally]:
    """One round of the agents, in a process of their own (the Runtime, its gateway and its
    actors keep this one): the seconds it took and its tally."""
    tally = Tally()
    secs = asyncio.run(
        run_way(
            way=way,
            a=argparse.Namespace(**a),
            tag=tag,
            tally=tally,
            urls=urls,
            picker=Serving(pool_file),
            until=until,
        )
    )
    return secs, tally


def start_proxy(pool_file: Path, flags: list[str], stack: contextlib.ExitStack) -> str:
    """A pass-through proxy (``benchmarks/passthrough.py``) in a process of its own, serving;
    its URL. The stack stops it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "passthrough.py"), "--pool", str(pool_file),
         "--port", str(port), *flags],
        cwd=ROOT,
    )  # fmt: skip

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    stack.callback(stop)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the proxy {flags} exited {proc.returncode}")
        try:
            return httpx.get(url + "/", timeout=1).status_code == 404
        except httpx.HTTPError:
            return False

    wait_until(up, 30, "the pass-through proxy serving", every=0.1)
    return url


def cpu_seconds() -> dict[int, tuple[str, float]]:
    """pid -> (command line, user + system CPU seconds so far) of this process and every
    process under it, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, str, float]] = {}  # pid -> (parent, command line, seconds)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        stats[int(d.name)] = (
            int(fields[1]),
            cmd.strip(),
            (int(fields[11]) + int(fields[12])) / tick,
        )
    mine, grew = {os.getpid()}, True
    while grew:
        more = {pid for pid, (parent, _, _) in stats.items() if parent in mine} - mine
        mine |= more
        grew = bool(more)
    return {pid: (stats[pid][1], stats[pid][2]) for pid in mine if pid in stats}


@contextlib.contextmanager
def profiled(where: str | None, name: str, rate: int, children: bool = True) -> Iterator[None]:
    """While in the block, py-spy samples this process and (``children``) every process under it
    (pearld's threads, the worker hosts, the worker servers, the proxies, the agents) ``rate``
    times a second, into ``where/name.txt`` (raw: one stack and its count a line, the process and
    thread first; idle threads left out), and ``where/name.cpu.json`` has each process's CPU
    seconds in the block (from /proc: exact, py-spy's own cost not included). Nothing when
    ``where`` is None."""
    if where is None:
        yield
        return
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    out = Path(where) / f"{name}.txt"
    proc = subprocess.Popen(
        [spy, "record", "--pid", str(os.getpid()), *(["--subprocesses"] if children else []),
         "--threads", "--rate", str(rate), "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # py-spy attaches to every process before the round starts
    before = cpu_seconds()
    try:
        yield
    finally:
        after = cpu_seconds()
        proc.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
        proc.wait(60)
        used = {
            str(pid): {"cmd": cmd[:200], "cpu_s": round(s - before.get(pid, (cmd, 0.0))[1], 3)}
            for pid, (cmd, s) in after.items()
            if pid != proc.pid
        }
        (Path(where) / f"{name}.cpu.json").write_text(json.dumps(used, indent=1))


def storm(rt: pearl.Runtime, pool: Pool, label: str, cycles: int) -> Callable[[], None]:
    """``cycles`` joins, each reclaimed while turns run on it, and a borrow cycle after each."""

    def running_on_joiners() -> bool:
        for w in rt.status().workers:
            if set(w.gpus) & set(JOINERS) and w.activity == "active":
                try:
                    m = parse_metrics(call(pool.urls.get(w.id, "") + "/metrics", timeout_s=2.0))
                except (EngineError, OSError, ValueError):
                    continue
                if m.get("sglang:num_running_reqs", 0) > 0:
                    return True
        return False

    def run() -> None:
        for cycle in range(1, cycles + 1):
            rt.event(ev.GpusAdded(gpus=JOINERS))

            def joined() -> bool:
                on = [w for w in rt.status().workers if set(w.gpus) & set(JOINERS)]
                return sum(w.activity == "active" for w in on) == len(JOINERS)

            wait_until(joined, 120, "the joiners serving", every=0.1)
            pool.refresh()
            if not poll(running_on_joiners, 30, 0.01):  # few sessions may all live elsewhere
                print(f"  {label} storm cycle {cycle}: no turn ran on a joiner", flush=True)
            rt.event(ev.GpusReclaimed(gpus=JOINERS))
            step = rt.status().training_step + 1
            rt.event(ev.TrainingBegin(step=step))
            wait_training_may_proceed(rt.status, step, timeout_s=60)
            rt.event(ev.TrainingFinished(step=step))
            print(f"  {label} storm cycle {cycle}: a reclaim with turns running, a borrow cycle",
                  flush=True)  # fmt: skip

    return run


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=("sim", "torch"), default="sim")
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--obs", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--storm-cycles", type=int, default=2)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--small", action="store_true", help="8 sessions x 2 turns, one round")
    ap.add_argument(
        "--client", choices=("shared", "per-session"), default="shared",
        help="the agents' httpx clients: one for all sessions, or one each (see run_way)",
    )  # fmt: skip
    ap.add_argument(
        "--profile", metavar="DIR",
        help="py-spy every round (all of its processes) into DIR/WAY-ROUND.txt (raw stacks)",
    )  # fmt: skip
    ap.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument(
        "--processes", type=int, default=0,
        help="gateway processes (gateway.processes); 0: the gateway runs in pearld",
    )  # fmt: skip
    ap.add_argument(
        "--structured",
        action="store_true",
        help="also structured_ratio (bench_structured.py) and n_ratio (bench_n.py)",
    )
    a = ap.parse_args()
    if a.small:
        a.sessions, a.turns, a.rounds, a.storm_cycles = 8, 2, 1, 1
    if a.engine == "torch" and not a.small:
        a.tokens = min(a.tokens, 16)

    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    router_port = free_port()
    router = launch_router("127.0.0.1", router_port)  # cache-aware, sglang-router's default
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / "local-cpu.toml",
        state_dir=work / "state",
        overrides=[*settings(a.engine, free_port() + 200), f"gateway.processes={a.processes}"],
    )
    rt.start()
    pool: Pool | None = None
    stack = contextlib.ExitStack()
    try:
        assert rt.gateway_url is not None
        urls = {
            "gateway": rt.gateway_url.removesuffix("/v1"),
            "router": f"http://127.0.0.1:{router_port}",
        }

        def serving() -> int:
            return sum(w.activity == "active" and w.role != "training" for w in rt.status().workers)

        wait_until(lambda: serving() >= 3, 180, "the workers serving", every=0.2)
        pool_file = work / "serving.json"
        pool = Pool(rt, urls["router"], pool_file)
        for way, flags in PROXIES.items():
            urls[way] = start_proxy(pool_file, flags, stack)
        spawn = multiprocessing.get_context("spawn")
        procs = stack.enter_context(ProcessPoolExecutor(1, mp_context=spawn))
        manager = stack.enter_context(spawn.Manager())

        def round_of(way: str, tag: str, until: Any = None) -> tuple[float, Tally]:
            pool.paused = way == "gateway"
            try:
                fut = procs.submit(agents_process, way, vars(a), tag, urls, str(pool_file), until)
                return fut.result()
            finally:
                pool.paused = False

        print(f"bench_gateway: {a.sessions} sessions x {a.turns} turns x {a.tokens} tokens on "
              f"{serving()} {a.engine} workers", flush=True)  # fmt: skip

        rates: dict[str, list[float]] = {w: [] for w in WAYS}
        lat: dict[str, list[float]] = {w: [] for w in WAYS}
        for r in range(a.rounds):
            order = WAYS[r % len(WAYS) :] + WAYS[: r % len(WAYS)]
            for way in order:
                with profiled(a.profile, f"{way}-{r + 1}", a.profile_rate):
                    secs, tally = round_of(way, f"{way[0]}{r}")
                if tally.failed:
                    print(f"  {way}: {tally.failed} failed: {tally.errors[:3]}", flush=True)
                rates[way].append(tally.tokens / secs)
                lat[way] += tally.latencies
                print(f"  round {r + 1}: {way:8s} {tally.tokens / secs:8.1f} tok/s, p50 "
                      f"{pct(tally.latencies, 0.5) * 1e3:.1f} ms", flush=True)  # fmt: skip
        # The sessions' workers, as the in-process gateway's book holds them (none with
        # gateway processes: each keeps its own)
        backend = rt.daemon.gateway_backend
        opened = backend.sessions.open.values() if backend is not None else ()
        homes = [s.workers for s in opened if len(s.workers) > 1]
        hits = sum(w == s[0] for s in homes for w in s[1:])
        turns_after_first = sum(len(s) - 1 for s in homes)

        storms: dict[str, Tally] = {}
        for way in WAYS:
            done = manager.Event()
            with ThreadPoolExecutor(1) as th:
                agents_round = th.submit(round_of, way, f"s{way[0]}", done)
                try:
                    storm(rt=rt, pool=pool, label=way, cycles=a.storm_cycles)()
                finally:
                    done.set()
                _, storms[way] = agents_round.result()
            print(f"  {way} storm: {storms[way].failed} failed", flush=True)
    finally:
        stack.close()
        if pool is not None:
            pool.close()
        rt.stop()
        router.stop()

    tok = {w: statistics.median(rates[w]) for w in WAYS}
    gw = storms["gateway"]
    out = {
        "engine": a.engine,
        "sessions": a.sessions,
        "client": a.client,
        "gateway_tok_s": tok["gateway"],
        "direct_tok_s": tok["direct"],
        "router_tok_s": tok["router"],
        "ratio_direct": tok["gateway"] / tok["direct"],
        "ratio_router": tok["gateway"] / tok["router"],
        "proxy_tok_s": tok["proxy"],
        "ratio_proxy": tok["gateway"] / tok["proxy"],
        "pinned_tok_s": tok["pinned"],
        "ratio_pinned": tok["gateway"] / tok["pinned"],
        "p50_added_ms": (pct(lat["gateway"], 0.5) - pct(lat["direct"], 0.5)) * 1e3,
        "p99_added_ms": (pct(lat["gateway"], 0.99) - pct(lat["direct"], 0.99)) * 1e3,
        "p50_ms": {w: pct(lat[w], 0.5) * 1e3 for w in WAYS},
        "p99_ms": {w: pct(lat[w], 0.99) * 1e3 for w in WAYS},
        "failed_requests": gw.failed,
        "direct_failed_requests": storms["direct"].failed,
        "router_failed_requests": storms["router"].failed,
        "proxy_failed_requests": storms["proxy"].failed,
        "pinned_failed_requests": storms["pinned"].failed,
        "recomputed_tokens": gw.recomputed,
        "migrations": gw.migrations,
        "affinity_hit_ratio": hits / turns_after_first if turns_after_first else None,
        "processes": a.processes,
    }
    if a.structured:  # torch engine, in-process, after the runtime has stopped
        from benchmarks.bench_n import n_ratio
        from benchmarks.bench_structured import structured_ratio

        rounds = 1 if a.small else 3
        out.update(structured_ratio(rounds=rounds))
        out.update(n_ratio(rounds=rounds))
        print(f"structured / free: {out['structured_ratio']:.3f}x ({out['json_tokens_per_s']:.0f}"
              f" / {out['free_tokens_per_s']:.0f} tok/s, mask {out['mask_share']:.0%} of the "
              f"constrained time); n=8 / 8 separate: {out['n_ratio']:.3f}x")  # fmt: skip
    print(f"gateway / direct: {out['ratio_direct']:.3f}x, gateway / sglang-router: "
          f"{out['ratio_router']:.3f}x, gateway / proxy: {out['ratio_proxy']:.3f}x, gateway / "
          f"pinned: {out['ratio_pinned']:.3f}x (tok/s, medians of {a.rounds}: "
          + ", ".join(f"{w} {tok[w]:.0f}" for w in WAYS)
          + f"); added latency p50 {out['p50_added_ms']:.2f} ms, p99 {out['p99_added_ms']:.2f} "
          f"ms; storm failed: gateway {gw.failed} ({gw.migrations} migrated, {gw.recomputed} "
          "tokens recomputed), "
          + ", ".join(f"{w} {storms[w].failed}" for w in WAYS[1:])
          + f"; affinity {out['affinity_hit_ratio']}")  # fmt: skip
    if gw.errors:
        print("  gateway failures:", *gw.errors[:5], sep="\n    ")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0 if gw.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
