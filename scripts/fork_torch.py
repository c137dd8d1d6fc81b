"""A torch-engine worker host forked by the fork server, with and without torch imported first.

    python scripts/fork_torch.py [--rounds 3] [--batches 1 4] [--gen 64] [--json FILE]

pearld forks worker hosts from ``actors.forkserver``, which imports the engine's package once
(``--preload actors.worker_host,pearl.engines.torch``). When ``pearl.engines.torch`` loaded its
names lazily (c7dc16c, undone in 74fe069), that preload imported no torch, and the README's trainer
loop ran about 4x slower. This forks one child per variant from a real fork server and, in the
child, times what a host does:

- ``preloaded``: the server imported ``pearl.engines.torch`` (and torch) before forking;
- ``child-main``: the server imported only ``actors.worker_host``; the child imports torch on its
  main thread;
- ``child-thread``: the same, but the import happens on another thread (a host builds its engine
  on its actor's thread).

Per child: seconds from the fork request to the engine serving (import included), the import
alone, and the tiny preset's decode iteration time (median, the iterations in which all ``n``
sequences decoded), its CPU time a token, torch's intra-op threads and the process's threads.
Rounds alternate the variants; the figures are medians over rounds, as ratios to ``preloaded``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
VARIANTS = {
    "preloaded": ("actors.worker_host", "pearl.engines.torch"),
    "child-main": ("actors.worker_host",),
    "child-thread": ("actors.worker_host",),
}


def _threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def _decode(n: int, gen: int) -> dict[str, float]:
    from pearl.engines.base import GenerateRequest, SamplingParams
    from pearl.engines.torch import TorchEngine

    eng = TorchEngine(preset="tiny", device="cpu", threads=1, max_running=n)
    eng.start()
    try:
        prompt = tuple(range(1, 65))
        sampling = SamplingParams(max_new_tokens=gen, temperature=0.0)  # no stop ids
        for f in [
            eng.generate(GenerateRequest(rid=f"w{i}", input_ids=prompt, sampling=sampling))
            for i in range(n)
        ]:
            f.result(timeout=600)
        eng.telemetry()  # drop the warm-up's iterations
        cpu0 = time.process_time()
        for f in [
            eng.generate(GenerateRequest(rid=f"r{i}", input_ids=prompt, sampling=sampling))
            for i in range(n)
        ]:
            f.result(timeout=600)
        cpu = time.process_time() - cpu0
        its = [
            s.duration_s
            for s in eng.telemetry().iterations
            if s.decode_batch == n and s.prefill_tokens == 0
        ]
    finally:
        eng.stop()
    return {"iteration_ms": 1e3 * statistics.median(its), "cpu_ms_token": 1e3 * cpu / (n * gen)}


def main(argv: list[str] | None = None) -> int:
    """The child's side, run by the fork server: ``OUT VARIANT T_REQUEST GEN BATCH...``."""
    out, variant, t_request, gen, *batches = argv if argv is not None else sys.argv[1:]
    t0 = time.perf_counter()
    if variant == "child-thread":
        t = threading.Thread(target=importlib.import_module, args=("pearl.engines.torch",))
        t.start()
        t.join()
    else:
        importlib.import_module("pearl.engines.torch")
    imported = time.perf_counter() - t0
    import torch

    row: dict[str, Any] = {
        "variant": variant,
        "import_s": imported,
        "to_import_done_s": time.time() - float(t_request),
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
    }
    for n in batches:
        row[f"batch{n}"] = _decode(int(n), int(gen))
    row["process_threads"] = _threads()
    Path(out).write_text(json.dumps(row))
    return 0


def one(variant: str, tmp: Path, gen: int, batches: list[int]) -> dict[str, Any]:
    from actors.launcher import ForkServer

    server = ForkServer(VARIANTS[variant], stderr=tmp / "server.log")
    try:
        out = tmp / f"{variant}.json"
        out.unlink(missing_ok=True)
        server.spawn("fork_torch", [], dict(os.environ), None)  # waits for the preload
        argv = [str(out), variant, str(time.time()), str(gen), *map(str, batches)]
        server.spawn("fork_torch", argv, dict(os.environ), tmp / f"{variant}.log")
        deadline = time.monotonic() + 600
        while not out.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{variant}: no result; see {tmp / f'{variant}.log'}")
            time.sleep(0.05)
        time.sleep(0.05)  # written whole
        return dict(json.loads(out.read_text()))
    finally:
        server.close()


def run(rounds: int, gen: int, batches: list[int]) -> dict[str, list[dict[str, Any]]]:
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]
    )
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="fork-torch-") as d:
        for r in range(rounds):
            order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
            for v in order:
                rows[v].append(one(variant=v, tmp=Path(d), gen=gen, batches=batches))
    return rows


def report(rows: dict[str, list[dict[str, Any]]], batches: list[int]) -> None:
    def med(v: str, f: Any) -> float:
        return statistics.median(f(r) for r in rows[v])

    base = {n: med("preloaded", lambda r, n=n: r[f"batch{n}"]["iteration_ms"]) for n in batches}
    for v in VARIANTS:
        first = rows[v][0]
        parts = [
            f"{v:12s} import {med(v, lambda r: r['import_s']):5.2f} s",
            f"threads torch {first['torch_threads']} interop {first['interop_threads']} "
            f"process {first['process_threads']}",
        ]
        for n in batches:
            it = med(v, lambda r, n=n: r[f"batch{n}"]["iteration_ms"])
            cpu = med(v, lambda r, n=n: r[f"batch{n}"]["cpu_ms_token"])
            parts.append(f"batch {n}: {it:6.2f} ms/it ({it / base[n]:.2f}x), {cpu:.2f} cpu-ms/tok")
        print("; ".join(parts), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    rows = run(a.rounds, a.gen, a.batches)
    report(rows, a.batches)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
