"""``n = 8`` samples of one request against eight separate requests, torch engine.

One prompt of 512 tokens; each way generates 8 x ``max_tokens`` tokens at temperature 1 with
seeds s..s+7. The ``n`` way submits eight sequences of one group (``GenerateRequest.group``):
one prefills the prompt, the others copy its K/V. The separate way submits eight requests
without a group: each prefills. Prints tokens/s of each and their ratio (``n_ratio``), measured
in the same run; ``bench_gateway.py --json`` carries it.

    python benchmarks/bench_n.py [--prompt 512] [--max-tokens 32] [--rounds 3] [--small]
"""

from __future__ import annotations

import argparse
import json
import time

from pearl.engines.base import GenerateRequest, SamplingParams
from pearl.engines.torch.engine import TorchEngine


def _round(engine: TorchEngine, prompt: tuple[int, ...], n: int, max_tokens: int, tag: str,
           grouped: bool) -> tuple[int, float]:  # fmt: skip
    sp = [SamplingParams(max_new_tokens=max_tokens, temperature=1.0, seed=100 + i)
          for i in range(n)]  # fmt: skip
    t0 = time.perf_counter()
    futures = [
        engine.generate(
            GenerateRequest(
                rid=f"{tag}-{i}", input_ids=prompt, sampling=sp[i], group=tag if grouped else ""
            )
        )
        for i in range(n)
    ]
    tokens = sum(len(f.result(600).output_ids) for f in futures)
    return tokens, time.perf_counter() - t0


def n_ratio(prompt_len: int = 512, n: int = 8, max_tokens: int = 32, rounds: int = 3) -> dict:
    """Tokens/s of ``n`` samples of one request over ``n`` separate requests (same run)."""
    engine = TorchEngine(preset="tiny", kv_budget_bytes=256 << 20)
    engine.start()
    try:
        vocab = engine.vocab_size
        out: dict[str, list[float]] = {"n": [], "separate": []}
        for r in range(rounds + 1):  # the first round warms up
            for way in ("separate", "n"):
                prompt = tuple((7 * r + 13 * i + 1) % vocab for i in range(prompt_len))
                tokens, took = _round(engine, prompt, n, max_tokens, f"{way}{r}", way == "n")
                if r:
                    out[way].append(tokens / took)
        n_tps = sorted(out["n"])[len(out["n"]) // 2]
        sep_tps = sorted(out["separate"])[len(out["separate"]) // 2]
        return {"n_tokens_per_s": n_tps, "separate_tokens_per_s": sep_tps,
                "n_ratio": n_tps / sep_tps}  # fmt: skip
    finally:
        engine.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="a 128-token prompt, 8 tokens, 1 round")
    a = ap.parse_args()
    if a.small:
        a.prompt, a.max_tokens, a.rounds = 128, 8, 1
    print(json.dumps(n_ratio(a.prompt, a.n, a.max_tokens, a.rounds), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
