"""Torch engine on CPU: colocated 2C vs disaggregated 1P1D, the fitted cost model, and KV transfer.

Two worker processes, each pinned to its own core with one torch thread, run the ``small`` preset.
A driver (this process) plays a multi-turn agentic workload: B trajectories, S turns each; a turn
generates r tokens greedily, then the environment answers after ``env`` ms with new observation
tokens appended to the context (same trajectory id: prefix reuse). Both configurations run in the
same processes, one after the other, with the memory released and resumed in between:

- 2C: both workers colocated, trajectories split between them;
- 1P1D: worker 0 prefill, worker 1 decode, the KV cache over ZeroMQ.

Printed: throughput of both (tokens/s, ratio against 2C), A and b fitted by least squares on the
pure-decode iterations (with R^2), t_prefill, the KV transfer rate against a raw ZeroMQ bulk send
of the same message sizes between the same processes, and the makespans eq. 1-3
(``pearl.core.makespan``) predict from the fitted profile against the measured ones.

    .venv/bin/python benchmarks/bench_engine.py [--trajectories 32 --turns 4 ...]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pearl.core.schema import from_plain, to_plain  # noqa: E402
from pearl.core.state import Role  # noqa: E402
from pearl.engines.base import GenerateRequest, SamplingParams  # noqa: E402
from transports.bulk import bulk_recv, bulk_send, make_socket  # noqa: E402

# -- worker process -------------------------------------------------------------------------------


def worker_main(core: int, preset: str, token_budget: int, kv_budget: int) -> None:
    """One engine pinned to ``core``, driven over a ROUTER socket with msgpack messages."""
    os.sched_setaffinity(0, {core})
    from pearl.engines.torch import TorchEngine
    from transports.bulk import ZmqKVChannel

    ctx = zmq.Context.instance()
    ctl = make_socket(ctx, zmq.ROUTER)
    ctl.bind("tcp://127.0.0.1:*")
    done = make_socket(ctx, zmq.PULL)  # results from engine-thread callbacks
    done.bind(f"inproc://done-{core}")
    local = threading.local()
    channel = ZmqKVChannel()
    engine = TorchEngine(preset=preset, kv_channel=channel, threads=1, token_budget=token_budget,
                         kv_budget_bytes=kv_budget)
    engine.start()
    for i in range(3):  # warm-up: first iterations pay one-off allocation costs
        engine.generate(GenerateRequest(f"warm{i}", tuple(range(1, 200)),
                                        SamplingParams(max_new_tokens=16))).result()
    engine.telemetry()
    gc.freeze()  # the model's and libraries' objects leave the collector's full passes (pauses)
    print("READY", ctl.getsockopt_string(zmq.LAST_ENDPOINT), channel.address, flush=True)

    def reply_later(ident: bytes, mid: int, fut: Any) -> None:
        sock = getattr(local, "sock", None)
        if sock is None:
            sock = local.sock = make_socket(ctx, zmq.PUSH)
            sock.connect(f"inproc://done-{core}")
        try:
            rep = {"id": mid, "ok": True, "result": to_plain(fut.result())}
        except Exception as e:
            rep = {"id": mid, "ok": False, "error": f"{type(e).__name__}: {e}"}
        sock.send_multipart([ident, msgpack.packb(rep)])

    sink: dict[str, Any] = {}
    poller = zmq.Poller()
    poller.register(ctl, zmq.POLLIN)
    poller.register(done, zmq.POLLIN)
    parent, stopping = os.getppid(), False
    while not stopping and os.getppid() == parent:  # an orphaned worker exits too
        for sock, _ in poller.poll(1000):
            if sock is done:
                ctl.send_multipart(done.recv_multipart())
                continue
            ident, raw = ctl.recv_multipart()
            msg = msgpack.unpackb(raw)
            mid, op = msg["id"], msg["op"]
            try:
                if op == "generate":
                    fut = engine.generate(from_plain(GenerateRequest, msg["req"]))
                    fut.add_done_callback(lambda f, i=ident, m=mid: reply_later(i, m, f))
                    continue
                result = _control(engine, channel, op, msg, sink)
                rep = {"id": mid, "ok": True, "result": result}
            except Exception as e:
                rep = {"id": mid, "ok": False, "error": f"{type(e).__name__}: {e}"}
            ctl.send_multipart([ident, msgpack.packb(rep)])
            stopping = op == "stop"
    engine.stop()
    channel.close()


def _control(engine: Any, channel: Any, op: str, msg: dict[str, Any],
             sink: dict[str, Any]) -> Any:
    if op == "telemetry":
        t = engine.telemetry()
        return {"iterations": [[i.t_start, i.duration_s, i.decode_batch, i.prefill_tokens]
                               for i in t.iterations],
                "transfers": [[x.bytes, x.duration_s, x.direction] for x in t.transfers]}
    if op == "set_role":
        engine.set_role(Role(msg["role"]))
    elif op == "release":
        engine.release_memory()
    elif op == "resume":
        engine.resume_memory()
    elif op == "sink":  # receive n messages on a thread: raw PULL, or the engine's KV channel
        got: list[tuple[int, float, float]] = []
        pull = None
        if msg["raw"]:  # one raw socket kept across calls: its TCP connection warms up like the
            if "pull" not in sink:  # channel's did during the run
                sink["pull"] = make_socket(zmq.Context.instance(), zmq.PULL)
                sink["pull"].bind("tcp://127.0.0.1:*")
            pull = sink["pull"]

        def drain(n: int = msg["n"]) -> None:
            for i in range(n):
                if pull is not None:
                    _, meta, bufs = bulk_recv(pull, 30.0)
                else:
                    meta, bufs = channel.receive(f"probe{i}", 30.0)
                got.append((sum(b.nbytes for b in bufs), meta["sent_at"], meta["arrived_at"]))

        sink["thread"] = threading.Thread(target=drain, daemon=True)
        sink["thread"].start()
        sink["got"] = got
        return pull.getsockopt_string(zmq.LAST_ENDPOINT) if pull is not None else channel.address
    elif op == "sink_result":
        sink["thread"].join(60)
        return sink["got"]
    elif op == "send":  # the same sizes as the run's KV transfers, raw or through the channel
        push = sink.get(msg["addr"]) if msg["raw"] else None
        if msg["raw"] and push is None:
            push = sink[msg["addr"]] = make_socket(zmq.Context.instance(), zmq.PUSH)
            push.connect(msg["addr"])
            time.sleep(0.2)  # the TCP connection is up before the clock starts, as in the run
        for i, n in enumerate(msg["sizes"]):
            buf = np.ones(n, dtype=np.uint8)
            if push is not None:
                bulk_send(push, f"probe{i}", {}, [buf])
            else:
                channel.send(msg["addr"], f"probe{i}", {}, [buf])
            if msg["gap_s"]:
                time.sleep(msg["gap_s"])
    elif op != "stop":
        raise ValueError(f"unknown op {op!r}")
    return None


# -- driver ---------------------------------------------------------------------------------------


class Worker:
    """The driver's handle on one worker process."""

    def __init__(self, core: int, args: argparse.Namespace) -> None:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(core),
               "--preset", args.preset, "--token-budget", str(args.token_budget),
               "--kv-budget-mib", str(args.kv_budget_mib)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "READY":
            raise RuntimeError(f"worker {core} failed to start: {line}")
        self.ctl_addr, self.kv_addr = line[1], line[2]
        self.sock = make_socket(zmq.Context.instance(), zmq.DEALER)
        self.sock.connect(self.ctl_addr)
        self._next = 0

    def send(self, op: str, **kw: Any) -> int:
        self._next += 1
        self.sock.send(msgpack.packb({"id": self._next, "op": op, **kw}))
        return self._next

    def call(self, op: str, timeout_s: float = 120.0, **kw: Any) -> Any:
        mid = self.send(op, **kw)
        if not self.sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"worker did not answer {op} within {timeout_s}s")
        rep = msgpack.unpackb(self.sock.recv())
        assert rep["id"] == mid, "control calls are made with no generate in flight"
        if not rep["ok"]:
            raise RuntimeError(rep["error"])
        return rep["result"]


@dataclass
class Run:
    name: str
    makespan_s: float = 0.0
    generated: int = 0
    prefilled_results: int = 0
    cached_tokens: int = 0
    telemetry: list[dict[str, Any]] = field(default_factory=list)


def observation(traj: int, turn: int, n: int) -> tuple[int, ...]:
    rng = np.random.default_rng(1000 * traj + turn)
    return tuple(int(x) for x in rng.integers(32, 127, n))


def play(name: str, workers: list[Worker], disaggregated: bool, a: argparse.Namespace) -> Run:
    """Run the whole multi-turn batch to completion; returns its makespan and counts."""
    run = Run(name)
    sp = to_plain(SamplingParams(max_new_tokens=a.gen))
    contexts = {t: observation(t, 0, a.first_prompt) for t in range(a.trajectories)}
    turns = dict.fromkeys(contexts, 0)
    pending: dict[tuple[int, int], int] = {}  # (worker, message id) -> trajectory
    timers: list[tuple[float, int]] = []
    poller = zmq.Poller()
    for w in workers:
        poller.register(w.sock, zmq.POLLIN)

    def submit(t: int) -> None:
        rid = f"{name}-{t}-{turns[t]}"
        req = {"rid": rid, "input_ids": contexts[t], "sampling": sp, "trajectory": f"{name}-{t}",
               "return_logprobs": True, "transfer_id": "", "kv_peer": ""}
        if disaggregated:
            req["transfer_id"] = rid
            pending[(1, workers[1].send("generate", req=req))] = t
            prefill = dict(req, kv_peer=workers[1].kv_addr)
            pending[(0, workers[0].send("generate", req=prefill))] = -1
        else:
            w = t % 2
            pending[(w, workers[w].send("generate", req=req))] = t

    t0 = time.monotonic()
    for t in contexts:
        submit(t)
    finished = 0
    while finished < a.trajectories:
        now = time.monotonic()
        while timers and timers[0][0] <= now:
            submit(heapq.heappop(timers)[1])
        wait = 1000 if not timers else max(0, int((timers[0][0] - now) * 1000))
        for sock, _ in poller.poll(wait):
            wi = next(i for i, w in enumerate(workers) if w.sock is sock)
            rep = msgpack.unpackb(sock.recv())
            t = pending.pop((wi, rep["id"]))
            if not rep["ok"]:
                raise RuntimeError(f"{name}: worker {wi} failed a request: {rep['error']}")
            res = rep["result"]
            if t < 0:
                run.prefilled_results += res["finish_reason"] == "prefilled"
                continue
            run.generated += len(res["output_ids"])
            run.cached_tokens += res["cached_tokens"]
            turns[t] += 1
            if turns[t] == a.turns:
                finished += 1
                continue
            contexts[t] = (contexts[t] + tuple(res["output_ids"])
                           + observation(t, turns[t], a.obs))
            heapq.heappush(timers, (time.monotonic() + a.env_ms / 1000, t))
    run.makespan_s = time.monotonic() - t0
    run.telemetry = [w.call("telemetry") for w in workers]
    return run


# -- analysis -------------------------------------------------------------------------------------


def fitted(runs: list[Run]) -> dict[str, float]:
    """A, b (pearl.core.profile.fit_decode) on pure-decode iterations; t_prefill on the rest."""
    from pearl.core.profile import fit_decode

    its = np.array([i for r in runs for t in r.telemetry for i in t["iterations"]], dtype=float)
    dur, batch, pre = its[:, 1], its[:, 2], its[:, 3]
    pure = (pre == 0) & (batch > 0)
    fit = fit_decode(batch[pure].tolist(), dur[pure].tolist())
    assert fit is not None, "no spread of decode batch sizes to fit"
    has = pre > 0
    resid = dur[has] - fit.A - fit.b * batch[has]
    t_prefill = float(pre[has] @ resid / (pre[has] @ pre[has]))
    # The same fit on the median time of each batch size seen >= 3 times: how linear the cost
    # is once the noise of a shared machine is averaged out.
    sizes = [k for k in np.unique(batch[pure]) if np.sum(batch[pure] == k) >= 3]
    medians = [float(np.median(dur[pure][batch[pure] == k])) for k in sizes]
    robust = fit_decode([float(k) for k in sizes], medians)
    return {"A": fit.A, "b": fit.b, "r2": fit.r2, "n": float(fit.n), "t_prefill": t_prefill,
            "r2_medians": robust.r2 if robust else float("nan"), "sizes": float(len(sizes))}


def active_fraction(run: Run, B: int) -> float:
    """f: time-averaged share of the B trajectories decoding on the decode worker."""
    its = np.array(run.telemetry[1]["iterations"], dtype=float)
    return float(its[:, 1] @ its[:, 2] / (B * run.makespan_s))


def predict(run: Run, fit: dict[str, float], a: argparse.Namespace, disaggregated: bool,
            kv: dict[str, float]) -> float:
    """Makespan eq. 1 (2C) or eq. 2-3 (1P1D) predict from the fitted and measured profile."""
    from pearl.core.makespan import T_coloc, T_dis
    from pearl.core.profile import WorkloadProfile

    B, S = a.trajectories, a.turns
    prefill_tokens = sum(i[3] for t in run.telemetry for i in t["iterations"])
    delta_L = prefill_tokens / (B * S)  # what each turn really prefills (after prefix reuse)
    f = active_fraction(run, B) if disaggregated else 1.0
    p = WorkloadProfile(
        B=B, S=S, delta_L=delta_L, r=a.gen, theta=(1 - f) / f, A=fit["A"], b=fit["b"],
        t_prefill=fit["t_prefill"], T_env=(S - 1) * a.env_ms / 1000, T_over=0.0,
        K=kv["bytes"] / max(prefill_tokens, 1) if disaggregated else 0.0, K_seq=0.0,
        H_max=a.kv_budget_mib * 2**20, BW=max(kv["idle"], 1.0), T_toggle=0.0)
    return float(T_dis(p, 1, 1)) if disaggregated else float(T_coloc(p, 2))


def kv_rates(run: Run, workers: list[Worker]) -> dict[str, float]:
    """Median GB/s per KV transfer of the run (send -> usable at the decode engine), and of the
    same sizes sent again between the same processes while idle: through the engines' KV
    channels, and raw ZeroMQ (the baseline). Idle sends go one at a time, 5 ms apart, so no
    message waits behind another; ``raw_stream`` sends back to back (bytes / total span).
    """
    recv = [x for x in run.telemetry[1]["transfers"] if x[2] == "recv"]
    sizes = [int(x[0]) for x in recv]
    out = {"bytes": float(sum(sizes)), "n": float(len(sizes)),
           "run": float(np.median([n / max(d, 1e-9) for n, d, _ in recv]))}
    for label, raw, gap in (("warm-up", True, 0.0), ("idle", False, 0.005), ("raw", True, 0.005),
                            ("raw_stream", True, 0.0)):
        addr = workers[1].call("sink", n=len(sizes), raw=raw)
        workers[0].call("send", addr=addr, sizes=sizes, gap_s=gap, raw=raw)
        got = workers[1].call("sink_result")
        if gap:
            out[label] = float(np.median([n / max(arr - sent, 1e-9) for n, sent, arr in got]))
        else:
            span = max(arr for *_, arr in got) - min(sent for _, sent, _ in got)
            out[label] = out["bytes"] / span
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--first-prompt", type=int, default=192, help="tokens of the first prompt")
    ap.add_argument("--obs", type=int, default=96, help="observation tokens added per turn")
    ap.add_argument("--gen", type=int, default=48, help="tokens generated per turn")
    ap.add_argument("--env-ms", type=float, default=20.0, help="environment time per turn")
    ap.add_argument("--token-budget", type=int, default=256)
    ap.add_argument("--kv-budget-mib", type=int, default=512)
    ap.add_argument("--json", action="store_true", help="also print the figures as JSON")
    a = ap.parse_args()
    if a.worker >= 0:
        worker_main(a.worker, a.preset, a.token_budget, a.kv_budget_mib << 20)
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("needs two cores")
    load0 = os.getloadavg()[0]
    workers = [Worker(cores[0], a), Worker(cores[1], a)]
    try:
        coloc = play("2C", workers, False, a)
        for w, role in zip(workers, (Role.PREFILL, Role.DECODE), strict=True):
            w.call("release")  # a fresh KV pool: no prefix left over from the 2C run
            w.call("resume")
            w.call("set_role", role=role.value)
        dis = play("1P1D", workers, True, a)
        want = a.trajectories * a.turns
        assert coloc.generated == dis.generated == want * a.gen, "a run lost tokens"
        assert dis.prefilled_results == want, "a prefill did not hand its KV over"
        fit = fitted([coloc, dis])
        kv = kv_rates(dis, workers)
        for w in workers:
            w.call("stop")
    finally:
        for w in workers:
            try:
                w.proc.wait(10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
    report(a, coloc, dis, fit, kv, (load0, os.getloadavg()[0]))


def report(a: argparse.Namespace, coloc: Run, dis: Run, fit: dict[str, float],
           kv: dict[str, float], load: tuple[float, float]) -> None:
    pred = {"2C": predict(coloc, fit, a, False, kv), "1P1D": predict(dis, fit, a, True, kv)}
    base = coloc.generated / coloc.makespan_s
    print(f"\nworkload: {a.trajectories} trajectories x {a.turns} turns, first prompt "
          f"{a.first_prompt}, +{a.obs} observation tokens/turn, {a.gen} generated/turn, env "
          f"{a.env_ms:.0f} ms; preset {a.preset}, one core + one torch thread per worker; load "
          f"average {load[0]:.2f} before, {load[1]:.2f} after (2 workers + this driver ~ 2)\n")
    print(f"{'config':<6} {'makespan s':>10} {'tokens/s':>9} {'vs 2C':>6} {'predicted s':>11} "
          f"{'error':>7}")
    rows = {}
    for r in (coloc, dis):
        tps = r.generated / r.makespan_s
        err = (pred[r.name] - r.makespan_s) / r.makespan_s
        rows[r.name] = {"makespan_s": r.makespan_s, "tokens_per_s": tps, "predicted_s":
                        pred[r.name], "error": err, "cached_tokens": r.cached_tokens}
        print(f"{r.name:<6} {r.makespan_s:>10.2f} {tps:>9.1f} {tps / base:>6.2f} "
              f"{pred[r.name]:>11.2f} {err:>+7.1%}")
    print(f"\ndecode fit  A = {fit['A'] * 1e3:.2f} ms, b = {fit['b'] * 1e3:.3f} ms/sequence, "
          f"R^2 = {fit['r2']:.3f} over {int(fit['n'])} pure-decode iterations "
          f"(R^2 = {fit['r2_medians']:.3f} on the medians of {int(fit['sizes'])} batch sizes); "
          f"t_prefill = {fit['t_prefill'] * 1e6:.1f} us/token")
    print(f"KV transfer {kv['bytes'] / 1e6:.1f} MB in {int(kv['n'])} transfers, median GB/s "
          f"per transfer: raw ZeroMQ baseline {kv['raw'] / 1e9:.2f}, KV channel idle "
          f"{kv['idle'] / 1e9:.2f} ({kv['idle'] / kv['raw']:.2f}x), KV channel in the run "
          f"{kv['run'] / 1e9:.2f} ({kv['run'] / kv['raw']:.2f}x: send -> usable at the busy "
          f"decode engine); raw streaming {kv['raw_stream'] / 1e9:.2f}")
    print("predictions: pearl.core.makespan T_coloc (eq. 1, N=2) and T_dis (eq. 2-3, 1P1D), "
          "delta_L = measured prefill tokens per turn, theta from the decode worker's batch")
    if a.json:
        print(json.dumps({"runs": rows, "fit": fit, "kv": kv}))


if __name__ == "__main__":
    main()
