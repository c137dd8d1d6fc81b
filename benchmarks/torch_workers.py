"""Torch-engine worker processes for the engine benchmarks (bench_engine.py, bench_pd.py).

A worker is one ``TorchEngine`` in its own process, pinned to one core with one torch thread
(optionally a virtual device of a share of that core, :mod:`pearl.engines.device`), driven by the
benchmark's process over a ZeroMQ ROUTER socket with msgpack messages; prefill workers send the
KV cache straight to decode workers over the engines' KV channels. :func:`play` runs a multi-turn
agentic batch on a set of workers, colocated or split into prefill and decode workers:
B trajectories, S turns each; a turn generates r tokens greedily, then the environment answers
after ``env_ms`` with new observation tokens appended to the context (same trajectory id: prefix
reuse).

    python benchmarks/torch_workers.py --worker CORE ...   (spawned by :class:`Worker`)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import heapq
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
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from pearl.core.schema import from_plain, to_plain  # noqa: E402
from pearl.core.state import Role  # noqa: E402
from pearl.engines.base import GenerateRequest, SamplingParams  # noqa: E402
from transports.bulk import bulk_recv, bulk_send, make_socket  # noqa: E402

# -- worker process -------------------------------------------------------------------------------


def worker_main(
    core: int,
    preset: str,
    token_budget: int,
    kv_budget: int,
    device_share: float | None = None,
    slot: int | None = None,
) -> None:
    """One engine pinned to ``core``, driven over a ROUTER socket with msgpack messages.

    ``device_share``: the engine is a virtual device of that share of one core
    (:mod:`pearl.engines.device`); None runs it unthrottled. ``slot`` names its inproc sockets
    when several workers share a core (default: the core)."""
    os.sched_setaffinity(0, {core})
    from pearl.engines.torch import TorchEngine
    from transports.bulk import ZmqKVChannel

    ctx = zmq.Context.instance()
    ctl = make_socket(ctx, zmq.ROUTER)
    ctl.bind("tcp://127.0.0.1:*")
    done = make_socket(ctx, zmq.PULL)  # results from engine-thread callbacks
    slot = core if slot is None else slot
    done.bind(f"inproc://done-{slot}")
    local = threading.local()
    channel = ZmqKVChannel()
    engine = TorchEngine(
        preset=preset,
        kv_channel=channel,
        threads=1,
        token_budget=token_budget,
        kv_budget_bytes=kv_budget,
        device_share=device_share,
    )
    engine.start()
    for i in range(3):  # warm-up: first iterations pay one-off allocation costs
        engine.generate(
            GenerateRequest(
                rid=f"warm{i}",
                input_ids=tuple(range(1, 200)),
                sampling=SamplingParams(max_new_tokens=16),
            )
        ).result()
    engine.telemetry()
    gc.freeze()  # the model's and libraries' objects leave the collector's full passes (pauses)
    print("READY", ctl.getsockopt_string(zmq.LAST_ENDPOINT), channel.address, flush=True)

    def reply_later(ident: bytes, mid: int, fut: Any) -> None:
        sock = getattr(local, "sock", None)
        if sock is None:
            sock = local.sock = make_socket(ctx, zmq.PUSH)
            sock.connect(f"inproc://done-{slot}")
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
                result = _control(engine=engine, channel=channel, op=op, msg=msg, sink=sink)
                rep = {"id": mid, "ok": True, "result": result}
            except Exception as e:
                rep = {"id": mid, "ok": False, "error": f"{type(e).__name__}: {e}"}
            ctl.send_multipart([ident, msgpack.packb(rep)])
            stopping = op == "stop"
    engine.stop()
    channel.close()


def _control(engine: Any, channel: Any, op: str, msg: dict[str, Any], sink: dict[str, Any]) -> Any:
    if op == "kv_bytes_per_token":
        return engine._bytes_per_token()
    if op == "telemetry":
        t = engine.telemetry()
        return {
            "iterations": [
                [i.t_start, i.duration_s, i.decode_batch, i.prefill_tokens] for i in t.iterations
            ],
            "transfers": [[x.bytes, x.duration_s, x.direction] for x in t.transfers],
        }
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
                bulk_send(sock=push, transfer_id=f"probe{i}", meta={}, frames=[buf])
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

    def __init__(
        self,
        core: int,
        args: argparse.Namespace,
        share: float | None = None,
        slot: int | None = None,
    ) -> None:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            str(core),
            "--preset",
            args.preset,
            "--token-budget",
            str(args.token_budget),
            "--kv-budget-mib",
            str(args.kv_budget_mib),
        ]
        if share is not None:
            cmd += ["--device-share", str(share), "--slot", str(core if slot is None else slot)]
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

    traj: dict[int, dict[str, int]] = field(default_factory=dict)  # per trajectory: counts
    active_s: float = 0.0  # integral over the run of (trajectories in an engine / unfinished)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.makespan_s if self.makespan_s else 0.0

    @property
    def active_fraction(self) -> float:
        """f: time-averaged share of unfinished trajectories in an engine (not in the env)."""
        return self.active_s / self.makespan_s if self.makespan_s else 0.0


def observation(traj: int, turn: int, n: int) -> tuple[int, ...]:
    rng = np.random.default_rng(1000 * traj + turn)
    return tuple(int(x) for x in rng.integers(32, 127, n))


def spread(mean: float, frac: float, traj: int, turn: int, salt: int) -> float:
    """``mean`` times a factor drawn uniformly from [1 - frac, 1 + frac], the same for the same
    trajectory, turn and salt in every run and configuration (0: exactly ``mean``)."""
    if frac <= 0:
        return mean
    rng = np.random.default_rng((1000 * traj + turn) * 16 + salt)
    return mean * float(rng.uniform(1.0 - frac, 1.0 + frac))


def turn_tokens(a: argparse.Namespace, traj: int, turn: int) -> int:
    """Tokens trajectory ``traj`` generates in ``turn``: ``a.gen``, spread by ``a.gen_spread``."""
    return max(
        1,
        round(spread(mean=a.gen, frac=getattr(a, "gen_spread", 0.0), traj=traj, turn=turn, salt=1)),
    )


def env_seconds(a: argparse.Namespace, traj: int, turn: int) -> float:
    """The environment's answer time after ``turn``: ``a.env_ms``, spread by ``a.env_spread``."""
    return (
        spread(mean=a.env_ms, frac=getattr(a, "env_spread", 0.0), traj=traj, turn=turn, salt=2)
        / 1000
    )


def set_roles(workers: list[Worker], n_prefill: int) -> None:
    """A fresh KV pool on every worker (no prefix left from an earlier run), then the roles:
    colocated (``n_prefill`` = 0) or the first ``n_prefill`` prefill and the rest decode."""
    for i, w in enumerate(workers):
        w.call("release")
        w.call("resume")
        role = Role.COLOCATED if not n_prefill else Role.PREFILL if i < n_prefill else Role.DECODE
        w.call("set_role", role=role.value)


def play(
    name: str,
    workers: list[Worker],
    n_prefill: int,
    a: argparse.Namespace,
    batch: int | None = None,
) -> Run:
    """Run the whole multi-turn batch to completion on ``workers`` (roles already set, see
    :func:`set_roles`): colocated when ``n_prefill`` is 0, trajectory t on worker t % N; else
    prefill on worker t % N_P (its prefix stays there), decode on worker N_P + t % N_D.
    Returns the makespan, the counts, each worker's telemetry of the run and the active fraction.
    ``a`` gives turns, first_prompt, obs, gen, env_ms (and trajectories unless ``batch``), and
    optionally gen_spread, env_spread: per-turn variation of the generated tokens and of the
    environment time (:func:`spread`), which keeps trajectories from moving in lockstep."""
    B = a.trajectories if batch is None else batch
    run = Run(name)
    contexts = {t: observation(t, 0, a.first_prompt) for t in range(B)}
    turns = dict.fromkeys(contexts, 0)
    run.traj = {
        t: {"turns": 0, "new": a.first_prompt, "generated": 0, "prefilled": 0, "steps": 0}
        for t in contexts
    }
    pending: dict[tuple[int, int], tuple[int, bool]] = {}  # (worker, id) -> (traj, is prefill)
    timers: list[tuple[float, int]] = []
    poller = zmq.Poller()
    for w in workers:
        poller.register(w.sock, zmq.POLLIN)
    n_d = len(workers) - n_prefill

    def submit(t: int) -> None:
        rid = f"{name}-{t}-{turns[t]}"
        req = {
            "rid": rid,
            "input_ids": contexts[t],
            "sampling": to_plain(SamplingParams(max_new_tokens=turn_tokens(a, t, turns[t]))),
            "trajectory": f"{name}-{t}",
            "return_logprobs": True,
            "transfer_id": "",
            "kv_peer": "",
        }
        if n_prefill:
            req["transfer_id"] = rid
            dw, pw = n_prefill + t % n_d, t % n_prefill
            pending[(dw, workers[dw].send("generate", req=req))] = (t, False)
            prefill = dict(req, kv_peer=workers[dw].kv_addr)
            pending[(pw, workers[pw].send("generate", req=prefill))] = (t, True)
        else:
            w = t % len(workers)
            pending[(w, workers[w].send("generate", req=req))] = (t, False)

    t0 = last = time.monotonic()
    for t in contexts:
        submit(t)
    finished, in_env = 0, 0
    while finished < B:
        now = time.monotonic()
        if finished < B:
            run.active_s += (now - last) * (B - finished - in_env) / (B - finished)
        last = now
        while timers and timers[0][0] <= now:
            in_env -= 1
            submit(heapq.heappop(timers)[1])
        wait = 1000 if not timers else max(0, int((timers[0][0] - now) * 1000))
        for sock, _ in poller.poll(wait):
            wi = next(i for i, w in enumerate(workers) if w.sock is sock)
            rep = msgpack.unpackb(sock.recv())
            t, is_prefill = pending.pop((wi, rep["id"]))
            if not rep["ok"]:
                raise RuntimeError(f"{name}: worker {wi} failed a request: {rep['error']}")
            res = rep["result"]
            n_prompt = len(contexts[t])
            if is_prefill or not n_prefill:
                run.traj[t]["prefilled"] += n_prompt - res["cached_tokens"]
            if is_prefill:
                run.prefilled_results += res["finish_reason"] == "prefilled"
                continue
            run.generated += len(res["output_ids"])
            run.traj[t]["generated"] += len(res["output_ids"])
            # the decode iterations it was in and the batch they held (the tracker's kappa)
            run.traj[t]["steps"] += res.get("decode_steps", 0)
            run.traj[t]["batch_sum"] = run.traj[t].get("batch_sum", 0) + res.get(
                "decode_batch_sum", 0
            )
            run.cached_tokens += res["cached_tokens"]
            turns[t] += 1
            run.traj[t]["turns"] = turns[t]
            if turns[t] == a.turns:
                finished += 1
                run.traj[t]["latency_ms"] = round(1000 * (time.monotonic() - t0))
                continue
            contexts[t] = contexts[t] + tuple(res["output_ids"]) + observation(t, turns[t], a.obs)
            run.traj[t]["new"] += len(res["output_ids"]) + a.obs
            in_env += 1
            heapq.heappush(timers, (time.monotonic() + env_seconds(a, t, turns[t] - 1), t))
        now = time.monotonic()
        run.active_s += (now - last) * (B - finished - in_env) / max(B - finished, 1)
        last = now
    run.makespan_s = time.monotonic() - t0
    run.telemetry = [w.call("telemetry") for w in workers]
    want = B * a.turns
    expected = sum(turn_tokens(a, t, k) for t in range(B) for k in range(a.turns))
    if run.generated != expected:
        raise RuntimeError(f"{name}: {run.generated} tokens generated, expected {expected}")
    if n_prefill and run.prefilled_results != want:
        raise RuntimeError(f"{name}: {run.prefilled_results} of {want} prefills handed KV over")
    return run


def kv_rates(run: Run, src: Worker, dst: Worker, dst_index: int) -> dict[str, float]:
    """Median GB/s per KV transfer of the run (send -> usable at the decode engine
    ``run.telemetry[dst_index]``), and of the same sizes sent again from ``src`` to ``dst`` while
    idle: through the engines' KV channels, and raw ZeroMQ (the baseline). Idle sends go one at a
    time, 5 ms apart, so no message waits behind another; ``raw_stream`` sends back to back
    (bytes / total span)."""
    recv = [x for x in run.telemetry[dst_index]["transfers"] if x[2] == "recv"]
    sizes = [int(x[0]) for x in recv]
    out = {
        "bytes": float(sum(sizes)),
        "n": float(len(sizes)),
        "run": float(np.median([n / max(d, 1e-9) for n, d, _ in recv])),
    }
    for label, raw, gap in (
        ("warm-up", True, 0.0),
        ("idle", False, 0.005),
        ("raw", True, 0.005),
        ("raw_stream", True, 0.0),
    ):
        addr = dst.call("sink", n=len(sizes), raw=raw)
        src.call("send", addr=addr, sizes=sizes, gap_s=gap, raw=raw)
        got = dst.call("sink_result")
        if gap:
            out[label] = float(np.median([n / max(arr - sent, 1e-9) for n, sent, arr in got]))
        else:
            span = max(arr for *_, arr in got) - min(sent for _, sent, _ in got)
            out[label] = out["bytes"] / span
    return out


def stop_all(workers: list[Worker]) -> None:
    """Stop the workers (a worker that does not answer is killed)."""
    for w in workers:
        with contextlib.suppress(Exception):
            w.call("stop", timeout_s=10)
    for w in workers:
        try:
            w.proc.wait(10)
        except subprocess.TimeoutExpired:
            w.proc.kill()


def _worker_cli() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", type=int, required=True)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--token-budget", type=int, default=256)
    ap.add_argument("--kv-budget-mib", type=int, default=512)
    ap.add_argument("--device-share", type=float, default=None)
    ap.add_argument("--slot", type=int, default=None)
    a = ap.parse_args()
    worker_main(
        core=a.worker,
        preset=a.preset,
        token_budget=a.token_budget,
        kv_budget=a.kv_budget_mib << 20,
        device_share=a.device_share,
        slot=a.slot,
    )


if __name__ == "__main__":
    _worker_cli()
