"""How many requests a second one pearld carries: the open-loop rate at which the p99 latency of
its HTTP gateway doubles, against ``sglang-router`` on the same workers.

    python benchmarks/bench_capacity.py [--sessions 256] [--step-s 6] [--json FILE] [--small]
                                        [--processes N]

One pearld (the embedded Runtime) serves SGLang-dialect workers whose generation is nearly free
(PEARL's facade over the sim engine at ``--sim-time-scale 0.0001``: a turn's model seconds pass
10,000 times faster), so what limits the rate is the data path, not the model. A load process of
its own sends ``/generate`` open-loop: arrivals at a fixed rate (Poisson, seeded), each for one
of ``--sessions`` sessions in turn (``X-Session-ID``), over keep-alive connections of a minimal
HTTP/1.1 client (an httpx client costs more CPU per request than the gateway does on this
machine; it would measure itself). A request's latency runs from its scheduled arrival, so a
server that falls behind shows it even when the client waits.

The rate steps up geometrically; at each step the gateway and the router run one after the
other (in alternating order), each step long enough for ``--min-requests``. A way's low-rate p99
is the lowest p99 of its steps so far; its knee is the first rate whose p99 reaches twice that,
confirmed by the next step (one slow step on a shared machine is not a knee), or the first rate
that fails requests; a way stops stepping once its knee is confirmed. pearld's CPU
seconds (from /proc, for this process, which embeds it) in the gateway's knee step (its last
step when it found none) give its requests per second per core: the rate it served there over
the cores it used, its background work (ticks, heartbeats) included; the marginal figure is
1 / the slope of pearld's cores over the rate served up to there (:func:`marginal`): what each
request adds, the figure a cluster's turn rate divides (``clusters``). With ``--processes N``
the gateway runs in N gateway processes (``gateway.processes``): pearld's cores are then its own
and theirs (from /proc), and each step also prints pearld's own, what is left on the control
plane's interpreter.

``--json FILE`` writes ``{"gateway_rps_per_core", "router_rps", "p99_knee_rps", "processes"}``
(``processes``: the processes the data path runs in, 1 when the gateway runs in pearld, which
``gateway_in_pearld`` tells apart from one gateway process) and the steps; the full run
adds ``clusters``: the cores pearld needs at the turn rates the simulator measures for the
paper's 32-GPU cluster and for 1,024 GPUs (:func:`turn_rates`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pearl  # noqa: E402
from benchmarks.bench_gateway import Pool, profiled, settings  # noqa: E402
from pearl.engines.sglang.router import launch_router  # noqa: E402
from pearl.testing.pearld import free_port  # noqa: E402
from pearl.testing.wait import wait_until  # noqa: E402

TIME_SCALE = 0.0001  # wall seconds per model second of the sim workers: nearly free
WAYS = ("gateway", "router")
GPUS_32, GPUS_1024 = 32, 1024


IDLE_S = 3.0  # a kept connection idle longer is closed: below the servers' keep-alive (5 s)


class Conn:
    """One keep-alive HTTP/1.1 connection: a request, then its whole response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used = time.monotonic()

    async def post(self, head: bytes, body: bytes) -> tuple[int, bytes, bool]:
        """(status, body, whether the connection stays open); ConnectionError when it closed
        before a response began (a kept connection the server had just closed)."""
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("closed before a response")
        status = int(status_line.split()[1])
        length, chunked, keep = -1, False, True
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and value == "close":
                keep = False
        if chunked:
            parts = []
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                parts.append(await self.reader.readexactly(size + 2))
            await self.reader.readline()
            data = b"".join(p[:-2] for p in parts)
        elif length >= 0:
            data = await self.reader.readexactly(length)
        else:
            data, keep = await self.reader.read(), False
        self.used = time.monotonic()
        return status, data, keep

    def close(self) -> None:
        self.writer.close()


async def open_loop(
    url: str, rate: float, seconds: float, sessions: int, tokens: int, prompt: int, seed: int
) -> tuple[list[float], list[str], float]:
    """Requests at ``rate`` a second for ``seconds`` (Poisson arrivals), each of ``prompt``
    token ids: the latencies of those that succeeded, why each failed one did, and the seconds
    until the last one ended."""
    host, port = url.removeprefix("http://").split(":")
    rng = random.Random(seed)
    prompts = [[rng.randrange(256) for _ in range(prompt)] for _ in range(sessions)]
    idle: list[Conn] = []
    latencies: list[float] = []
    failed: list[str] = []

    async def one(i: int, due: float) -> None:
        body = json.dumps(
            {
                "input_ids": prompts[i % sessions],
                "sampling_params": {"max_new_tokens": tokens, "temperature": 0.0},
            }
        ).encode()
        head = (
            f"POST /generate HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json"
            f"\r\nx-session-id: s{i % sessions}\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        conn = None
        while idle and conn is None:  # the most recently used first; stale ones closed
            conn = idle.pop()
            if time.monotonic() - conn.used > IDLE_S:
                conn.close()
                conn = None
        try:
            if conn is not None:
                try:
                    status, data, keep = await conn.post(head, body)
                except ConnectionError:  # closed by the server as it was reused: once more
                    conn.close()
                    conn = None
            if conn is None:
                conn = Conn(*await asyncio.open_connection(host, int(port)))
                status, data, keep = await conn.post(head, body)
            if status != 200 or b'"output_ids"' not in data:
                failed.append(f"{status} {data[:200]!r}")
            else:
                latencies.append(time.perf_counter() - due)
            if keep:
                idle.append(conn)
            else:
                conn.close()
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
            failed.append(f"{type(e).__name__}: {e}")
            if conn is not None:
                conn.close()

    t0 = time.perf_counter() + 0.05
    tasks, due, i = [], t0, 0
    while due < t0 + seconds:
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(i, due)))
        i += 1
        due += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    for c in idle:
        c.close()
    return latencies, failed, time.perf_counter() - t0


def load_process(
    url: str, rate: float, seconds: float, sessions: int, tokens: int, prompt: int, seed: int
) -> tuple[list[float], list[str], float]:
    """:func:`open_loop` in the load process."""
    return asyncio.run(open_loop(url, rate, seconds, sessions, tokens, prompt, seed))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def marginal(steps: list[dict[str, float]]) -> float:
    """Requests/s per core that a request adds: 1 / the least-squares slope of pearld's cores
    over the rate served, across ``steps`` (its background, the intercept, left out); nan with
    fewer than two steps or no rise."""
    if len(steps) < 2:
        return float("nan")
    xs, ys = [s["achieved"] for s in steps], [s["pearld_cpu"] for s in steps]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return 1.0 / slope if slope > 0 else float("nan")


def cpu_s() -> float:
    """This process's CPU seconds so far (pearld's, which it embeds)."""
    t = os.times()
    return t.user + t.system


def pid_cpu_s(pids: list[int]) -> float:
    """CPU seconds so far of the processes ``pids`` (the gateway processes), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # restarting: its CPU is not counted
        fields = stat.rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def turn_rates() -> dict[str, float]:
    """Turns per second of the paper's 32-GPU cluster (16 training, 4 reserved, up to 12
    preemptible GPUs) under PEARL, as the simulator measures them on the paper's traces (S1-S3,
    Qwen3-8B and Qwen3-30B-A3B): the highest rate of one batch's rollout (its turns over its
    rollout makespan) and the mean over whole steps, at the calibrated pace (the paper's step
    time) and at the catalog's roofline pace (``time_scale`` times faster)."""
    from pearl.sim import availability as av
    from pearl.sim.runner import Simulation
    from pearl.sim.scenario import POLICIES, scenario
    from pearl.sim.workload import generate_batch

    peak = mean = scale = 0.0
    for model in ("qwen3-8b", "qwen3-30b-a3b"):
        sc = scenario(model)
        scale = sc.engine.time_scale
        for seg in ("S1", "S2", "S3"):
            avail = av.load(None, segment_name=seg, start_min=None, minutes=None)
            steps = Simulation(sc, POLICIES["pearl"], avail).run().window()
            turns = [sum(t.turns for t in generate_batch(sc.workload, sc.seed, s.step))
                     for s in steps]  # fmt: skip
            peak = max(peak, *(n / s.rollout_s for n, s in zip(turns, steps, strict=True)))
            mean = max(mean, sum(turns) / sum(s.duration_s for s in steps))
    return {"peak": peak, "mean": mean, "roofline_peak": peak * scale, "time_scale": scale}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=8, help="max_new_tokens of each request")
    ap.add_argument("--prompt", type=int, default=32, help="token ids in each request's prompt")
    ap.add_argument("--start-rps", type=float, default=10.0)
    ap.add_argument("--factor", type=float, default=1.5, help="rate step: times the previous")
    ap.add_argument("--max-rps", type=float, default=2000.0)
    ap.add_argument("--step-s", type=float, default=6.0, help="seconds of arrivals per step")
    ap.add_argument("--min-requests", type=int, default=300, help="a step is at least this long")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--small", action="store_true", help="short steps, a coarse ladder")
    ap.add_argument(
        "--profile", metavar="DIR",
        help="py-spy pearld (this process) over each gateway step into DIR/gateway-RATE.txt",
    )  # fmt: skip
    ap.add_argument(
        "--processes", type=int, default=0,
        help="gateway processes (gateway.processes); 0: the gateway runs in pearld",
    )  # fmt: skip
    a = ap.parse_args()
    if a.small:
        a.step_s, a.start_rps, a.factor, a.max_rps, a.min_requests = 1.0, 20.0, 3.0, 540.0, 30

    work = Path(tempfile.mkdtemp(prefix="bench-capacity-"))
    router_port = free_port()
    router = launch_router("127.0.0.1", router_port)
    overrides = [
        f"engine.sglang.extra_args=--sim-time-scale {TIME_SCALE} --sim-start-s 1"
        if o.startswith("engine.sglang.extra_args=")
        else o
        for o in settings("sim", free_port() + 200)
    ]
    overrides.append(f"gateway.processes={a.processes}")
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / "local-cpu.toml", state_dir=work / "state", overrides=overrides
    )
    rt.start()

    def gateway_pids() -> list[int]:
        g = rt.daemon.gateway_processes
        return [p for p in g.pids if p] if g is not None else []

    pool: Pool | None = None
    steps: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
    knee: dict[str, float | None] = dict.fromkeys(WAYS)  # confirmed
    over: dict[str, float | None] = dict.fromkeys(WAYS)  # a step at twice the base, to confirm
    try:
        assert rt.gateway_url is not None
        urls = {
            "gateway": rt.gateway_url.removesuffix("/v1"),
            "router": f"http://127.0.0.1:{router_port}",
        }

        def serving() -> int:
            return sum(w.activity == "active" and w.role != "training" for w in rt.status().workers)

        wait_until(lambda: serving() >= 3, 180, "the workers serving", every=0.2)
        pool = Pool(rt, urls["router"], work / "serving.json")
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=spawn) as procs:
            for way in WAYS:  # warm: the load process, connections, first-request paths
                warm = (urls[way], a.start_rps, 1.0, a.sessions, a.tokens, a.prompt, 99)
                procs.submit(load_process, *warm).result()
            print(f"bench_capacity: {a.sessions} sessions, {a.prompt}-token prompts, "
                  f"{a.tokens} tokens a request, "
                  f"{serving()} sim workers at time scale {TIME_SCALE}", flush=True)  # fmt: skip
            rate, k = a.start_rps, 0
            while rate <= a.max_rps and any(knee[w] is None for w in WAYS):
                order = WAYS if k % 2 == 0 else WAYS[::-1]
                for way in order:
                    if knee[way] is not None:
                        continue
                    pool.paused = way == "gateway"  # nothing else asks pearld meanwhile
                    spy = a.profile if way == "gateway" else None
                    seconds = max(a.step_s, a.min_requests / rate)
                    with profiled(spy, f"gateway-{rate:g}", 250, children=False):
                        pids = gateway_pids()
                        c0, g0 = cpu_s(), pid_cpu_s(pids)
                        fut = procs.submit(
                            load_process, urls[way], rate, seconds, a.sessions, a.tokens,
                            a.prompt, k,
                        )  # fmt: skip
                        lat, errors, secs = fut.result()
                        own = cpu_s() - c0
                        used = own + pid_cpu_s(pids) - g0
                    pool.paused = False
                    p50, p99, failed = pct(lat, 0.5), pct(lat, 0.99), len(errors)
                    row = {"rate": rate, "achieved": len(lat) / secs, "p50_ms": p50 * 1e3,
                           "p99_ms": p99 * 1e3, "failed": failed,
                           "pearld_cpu": used / secs,
                           "pearld_own_cpu": own / secs}  # fmt: skip
                    base = min((s["p99_ms"] for s in steps[way]), default=p99 * 1e3)
                    steps[way].append(row)
                    if failed:
                        knee[way] = over[way] or rate
                    elif p99 * 1e3 >= 2 * base and len(steps[way]) > 1:
                        if over[way] is not None:
                            knee[way] = over[way]
                        else:
                            over[way] = rate
                    else:
                        over[way] = None  # one slow step: not a knee
                    print(f"  {way:8s} {rate:7.1f} rps offered, {row['achieved']:7.1f} served, "
                          f"p50 {p50 * 1e3:7.1f} ms, p99 {p99 * 1e3:7.1f} ms, {failed} failed, "
                          f"pearld {used / secs:.2f} cores"
                          + (f" ({own / secs:.2f} its own)" if a.processes else "")
                          + ("  <- p99 x2" if over[way] == rate else "")
                          + (f"  <- knee at {knee[way]:g}" if knee[way] is not None else ""),
                          flush=True)  # fmt: skip
                    if errors:
                        print("    failed:", *errors[:3], sep="\n      ", flush=True)
                rate, k = round(rate * a.factor, 1), k + 1
    finally:
        if pool is not None:
            pool.close()
        rt.stop()
        router.stop()

    gw = steps["gateway"]
    at = next((s for s in gw if s["rate"] == knee["gateway"]), gw[-1] if gw else None)
    per_core = at["achieved"] / at["pearld_cpu"] if at and at["pearld_cpu"] > 0 else float("nan")
    upto = gw[: gw.index(at) + 1] if at else []
    out_marginal = marginal(upto)
    out: dict[str, Any] = {
        "gateway_rps_per_core": per_core,
        "router_rps": knee["router"],
        "p99_knee_rps": knee["gateway"],
        "processes": max(1, a.processes),
        "gateway_in_pearld": a.processes == 0,
        "gateway_rps_per_core_marginal": out_marginal,
        "sessions": a.sessions,
        "prompt_tokens": a.prompt,
        "base_p99_ms": {w: min(s["p99_ms"] for s in steps[w]) for w in WAYS if steps[w]},
        "steps": steps,
    }
    reached = {w: knee[w] if knee[w] is not None else f">{steps[w][-1]['rate']:g}" for w in WAYS}
    print(
        f"gateway: p99 doubles at {reached['gateway']} rps (sglang-router: "
        f"{reached['router']} rps); pearld serves {per_core:.0f} requests/s per core "
        f"({1e3 / per_core:.2f} CPU ms a request at {at['rate'] if at else 0:g} rps); "
        f"{out_marginal:.0f} per core marginal (background left out)"
    )
    if not a.small:
        t = turn_rates()
        cores = {
            f"{n}_gpus": {
                pace: t[key] * n / GPUS_32 / out_marginal
                for pace, key in (("paper_peak", "peak"), ("roofline_peak", "roofline_peak"))
            }
            for n in (GPUS_32, GPUS_1024)
        }
        out["clusters"] = {"turns_per_s_32_gpus": t, "pearld_cores": cores}
        print(f"turns/s of the 32-GPU cluster: peak {t['peak']:.2f} at the paper's pace, "
              f"{t['roofline_peak']:.0f} at roofline; pearld cores: 32 GPUs "
              f"{cores['32_gpus']['paper_peak']:.4f} / {cores['32_gpus']['roofline_peak']:.2f}, "
              f"1,024 GPUs {cores['1024_gpus']['paper_peak']:.3f} / "
              f"{cores['1024_gpus']['roofline_peak']:.2f}")  # fmt: skip
    keys = ("gateway_rps_per_core", "router_rps", "p99_knee_rps", "processes")
    print(json.dumps({k: out[k] for k in (*keys, "gateway_rps_per_core_marginal")}))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
