"""vLLM under PEARL against the same vLLM servers called directly, in one run.

Two worker hosts, each a real vLLM server (``.venv-vllm``), serve a PEARL preset (``small``: 4
layers, heads of 32) written as a model directory with PEARL's byte tokenizer. The workload is
agentic: ``--agents`` agents run ``--turns`` turns each; a turn generates ``--tokens`` tokens
greedily, then the agent appends an observation of ``--obs`` tokens (its environment) and asks
again with the whole context.

- **Throughput**: the same agents on the same servers, through PEARL (``RolloutClient`` ->
  Router, which sends a trajectory's turns to the worker holding its prefix -> worker hosts ->
  vLLM) and directly (HTTP to the servers, each agent pinned to one
  server: client-side affinity). Rounds alternate the order; the ratio is of the medians. Greedy
  outputs must be equal both ways.
- **A reclaim under load**: the preemptible worker's GPU is reclaimed while turns run on it.
  Counted: turns migrated (resumed elsewhere with their prefix), prompt tokens the resumptions
  prefilled again, failed requests, and whether every agent's tokens equal its direct run.
- **A join**: ``gpus-added`` for that GPU again, timed until the table routes to its worker (the
  vLLM server's start included).

    python benchmarks/bench_vllm.py [--agents 16] [--turns 4] [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pearl  # noqa: E402
from actors import names  # noqa: E402
from actors.rollout_client import RolloutClient  # noqa: E402
from pearl.core import events as ev  # noqa: E402
from pearl.core.status import status_plain  # noqa: E402
from pearl.engines.base import GenerateRequest, SamplingParams  # noqa: E402
from pearl.engines.vllm.checkpoint import byte_tokenizer, preset_dir  # noqa: E402
from pearl.engines.vllm.client import VLLMClient  # noqa: E402
from pearl.engines.vllm.engine import body  # noqa: E402
from pearl.engines.vllm.launch import DEFAULT_VENV  # noqa: E402
from pearl.testing.wait import wait_until  # noqa: E402

Generate = Callable[[int, GenerateRequest], list[int]]  # (agent, request) -> generated ids


def free_base(n: int) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        with contextlib.ExitStack() as stack:
            try:
                for k in range(n):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port + k))
            except OSError:
                continue
            return port
    raise SystemExit("no run of free ports")


def serving(rt: Any) -> set[int]:
    s = status_plain(rt.status())
    if s["transitions"] or s["plan"] is not None:
        return set()
    return {
        w["gpus"][0] for w in s["workers"] if w["activity"] == "active" and w["role"] != "training"
    }


class Workload:
    """The agents' prompts and observations: fixed by the seed, so runs are comparable."""

    def __init__(self, agents: int, turns: int, tokens: int, obs: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.agents, self.turns, self.tokens = agents, turns, tokens
        self.prompts = [tuple(rng.randrange(1, 250) for _ in range(64)) for _ in range(agents)]
        self.obs = [
            [tuple(rng.randrange(1, 250) for _ in range(obs)) for _ in range(turns)]
            for _ in range(agents)
        ]

    def run(self, generate: Generate, tag: str) -> tuple[int, float, list[list[int]]]:
        """Every agent's turns, agents concurrent: (tokens generated, seconds, each agent's
        generated tokens in order)."""

        def agent(a: int) -> list[int]:
            ctx, mine = self.prompts[a], []
            for t in range(self.turns):
                sampling = SamplingParams(max_new_tokens=self.tokens, temperature=0.0)
                req = GenerateRequest(
                    rid=f"{tag}-a{a}-t{t}",
                    input_ids=ctx,
                    sampling=sampling,
                    trajectory=f"{tag}-a{a}",
                )
                out = generate(a, req)
                mine += out
                ctx = ctx + tuple(out) + self.obs[a][t]
            return mine

        t0 = time.monotonic()
        with ThreadPoolExecutor(self.agents) as pool:
            outs = list(pool.map(agent, range(self.agents)))
        return sum(map(len, outs)), time.monotonic() - t0, outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--obs", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument(
        "--small",
        action="store_true",
        help="4 agents x 1 turn x 160 tokens, one round, no join: a smoke run whose turns "
        "still run when the reclaim comes",
    )
    a = ap.parse_args()
    if a.small:
        a.agents, a.turns, a.tokens, a.rounds = 4, 1, 160, 1
    if not (DEFAULT_VENV / "bin" / "python").exists():
        raise SystemExit(f"no vLLM environment at {DEFAULT_VENV}: run `make vllm`")

    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    model = preset_dir(a.preset, 0, work / "model")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    tok = byte_tokenizer(work / "tokenizer", vocab)
    port = free_base(3)
    overrides = (
        "rl.env=",
        "cluster.training_gpus=0",
        "cluster.reserved_gpus=1",
        "cluster.preemptible_gpus=2",
        "cluster.initial_preemptible=2",
        "daemon.borrow=never",
        f"engine.vllm.model_path={model}",
        f"engine.vllm.tokenizer={tok}",
        f"engine.vllm.port={port}",
        "engine.vllm.max_model_len=2048",
        "engine.vllm.kv_cache_mb=128",
    )
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / "local-vllm.toml", state_dir=work / "state", overrides=overrides
    )
    w = Workload(agents=a.agents, turns=a.turns, tokens=a.tokens, obs=a.obs)
    rt.start()
    try:
        print(f"bench_vllm: 2 vLLM workers ({a.preset}), {a.agents} agents x {a.turns} turns x "
              f"{a.tokens} tokens; starting the servers ...", flush=True)  # fmt: skip
        wait_until(lambda: serving(rt) == {1, 2}, 900, "both vLLM workers to serve")
        client = RolloutClient(rt.daemon.directory, name="bench-client")
        servers = {1: VLLMClient(f"http://127.0.0.1:{port + 1}"),
                   2: VLLMClient(f"http://127.0.0.1:{port + 2}")}  # fmt: skip

        def direct(agent: int, req: GenerateRequest) -> list[int]:
            return list(servers[1 + agent % 2].completion(body(req), 600).run().token_ids)

        def through(agent: int, req: GenerateRequest) -> list[int]:
            return client.generate(req).result(600).output_ids

        w.run(direct, "warm")  # first requests compile nothing, but page in the servers
        rates: dict[str, list[float]] = {"direct": [], "pearl": []}
        reference: list[list[int]] | None = None
        equal = True
        for r in range(a.rounds):
            order = [("direct", direct), ("pearl", through)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                n, secs, outs = w.run(fn, f"{name}{r}")
                rates[name].append(n / secs)
                reference = reference or outs
                equal &= outs == reference
                print(f"  round {r + 1}: {name:6s} {n / secs:7.1f} tok/s ({n} tokens, {secs:.1f}s)",
                      flush=True)  # fmt: skip
        direct_tok_s = statistics.median(rates["direct"])
        pearl_tok_s = statistics.median(rates["pearl"])

        # A reclaim under load: GPU 2's worker leaves while agents' turns run on it.
        router = rt.daemon.directory.get(names.ROUTER).ref.proxy()
        on_2 = next(x["id"] for x in status_plain(rt.status())["workers"] if x["gpus"] == [2])
        migrated0, failed0 = client.migrated, client.failed
        done: dict[str, Any] = {}
        runner = threading.Thread(
            target=lambda: done.update(
                zip(("n", "s", "outs"), w.run(through, "reclaim"), strict=True)
            )
        )
        runner.start()
        wait_until(
            lambda: any(on_2 in p.workers for p in router.pending.get().values()),
            120,
            "turns in flight on the preemptible worker",
        )
        rt.event(ev.GpusReclaimed(gpus=(2,)))
        runner.join()
        migrated = client.migrated - migrated0
        failed = client.failed - failed0
        reclaim_equal = done.get("outs") == reference
        print(f"  reclaim under load: {migrated} turns migrated, {failed} failed, every agent "
              f"equal to its unmigrated run: {reclaim_equal}", flush=True)  # fmt: skip

        wait_until(lambda: serving(rt) == {1}, 120, "the reclaim to settle")
        join_s = None  # --small: no third server start (tests/engines/vllm times a join)
        if not a.small:
            t0 = time.monotonic()
            rt.event(ev.GpusAdded(gpus=(2,)))
            wait_until(lambda: serving(rt) == {1, 2}, 900, "the joiner to serve")
            join_s = time.monotonic() - t0
        client.close()
    finally:
        hosts = [int(p.read_text()) for p in (work / "state" / "workers").glob("*.pid")]
        with contextlib.suppress(Exception):
            rt.stop()
        for pid in hosts:
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)  # the model, its tokenizer, pearld's state

    ratio = pearl_tok_s / direct_tok_s
    out = {
        "through_pearl_tok_s": pearl_tok_s,
        "direct_tok_s": direct_tok_s,
        "ratio": ratio,
        "rounds": rates,
        "equal_to_direct": equal,
        "reclaims": 1,
        "failed_requests": failed,
        "migrated": migrated,
        "migrated_equal_to_unmigrated": reclaim_equal,
        "join_to_serving_s": join_s,
        "agents": a.agents,
        "turns": a.turns,
        "tokens": a.tokens,
        "preset": a.preset,
    }
    print(f"through PEARL / direct: {ratio:.3f} ({pearl_tok_s:.1f} / {direct_tok_s:.1f} tok/s, "
          f"medians of {a.rounds}); greedy outputs equal: {equal}; gpus-added -> serving "
          f"{'(not in --small)' if join_s is None else f'{join_s:.1f} s'}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0 if equal and reclaim_equal and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
