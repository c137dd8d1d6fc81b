"""Virtual devices: one slot's throughput against two slots' at the same share, torch engine.

Each slot is its own process (one torch engine, one torch thread, its own
:class:`~pearl.engines.device.VirtualDevice` at ``--share`` of a core), as worker hosts are:
threads of one process would share the GIL, and two slots waiting for one lock are not two
devices. A round runs one slot's batch of decode-heavy requests alone, then both slots' at once
(alternating the order round by round, so adjacent runs see the same load from the rest of the
machine). Prints each round's tokens/s and the median of two slots over one (``slots_ratio``);
two devices should give twice one's.

    python benchmarks/bench_device.py [--share 0.2] [--rounds 9] [--small] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

REQUESTS, PROMPT = 8, 24  # per slot: one batch of decode-heavy requests


def _slot(share: float, new: int, name: str, go: Any, results: Any) -> None:
    """One virtual device: a torch engine in its own process; the same batch after each ``go``."""
    from pearl.engines.base import GenerateRequest, SamplingParams
    from pearl.engines.torch import TorchEngine

    engine = TorchEngine(preset="tiny", seed=0, threads=1, device_share=share)
    engine.start()

    def batch(tag: str) -> int:
        sp = SamplingParams(max_new_tokens=new, temperature=1.0, seed=1)
        futs = [
            engine.generate(
                GenerateRequest(rid=f"{tag}{i}", input_ids=tuple(range(i, i + PROMPT)), sampling=sp)
            )
            for i in range(REQUESTS)
        ]
        return sum(len(f.result(120).output_ids) for f in futs)

    try:
        batch("warm")
        results.put((name, "ready", 0.0, 0.0, 0))
        while (cmd := go.get()) != "stop":
            t0 = time.monotonic()
            tokens = batch(cmd)
            results.put((name, cmd, t0, time.monotonic(), tokens))
    finally:
        engine.stop()


def slots_ratio(share: float, rounds: int, new: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    inbox = {n: ctx.Queue() for n in ("a", "b")}
    procs = [ctx.Process(target=_slot, args=(share, new, n, q, results), daemon=True)
             for n, q in inbox.items()]  # fmt: skip
    for p in procs:
        p.start()
    try:
        ready = {results.get(timeout=300)[:2] for _ in procs}
        assert ready == {("a", "ready"), ("b", "ready")}, ready

        def one() -> float:
            inbox["a"].put("one-")
            _, _, t0, t1, tokens = results.get(timeout=300)
            return float(tokens / (t1 - t0))

        def two() -> float:
            for q in inbox.values():
                q.put("two-")
            got = [results.get(timeout=300) for _ in procs]
            start, end = min(g[2] for g in got), max(g[3] for g in got)
            return float(sum(g[4] for g in got) / (end - start))

        pairs = []
        for r in range(rounds):
            if r % 2:
                b = two()
                a = one()
            else:
                a = one()
                b = two()
            pairs.append((a, b))
            print(f"round {r + 1}/{rounds}: 1 slot {a:.0f}, 2 slots {b:.0f} tok/s", flush=True)
        ratios = sorted(b / a for a, b in pairs)
        return {"share": share, "rounds": rounds, "one_slot_tok_s": [a for a, _ in pairs],
                "two_slots_tok_s": [b for _, b in pairs],
                "slots_ratio": ratios[len(ratios) // 2]}  # fmt: skip
    finally:
        for q in inbox.values():
            q.put("stop")
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--share", type=float, default=0.2, help="each slot's share of a core")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--new", type=int, default=48, help="tokens generated per request")
    ap.add_argument("--small", action="store_true", help="1 round of 8 tokens")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    a = ap.parse_args()
    if a.small:
        a.rounds, a.new = 1, 8
    out = slots_ratio(a.share, a.rounds, a.new)
    print(f"two slots / one slot at share {a.share}: {out['slots_ratio']:.2f}x (2.00x is ideal)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
