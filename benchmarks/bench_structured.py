"""A constrained request against the same unconstrained one, torch engine (``structured_ratio``).

The same prompts, the same seeds, back to back in one run: ``n`` requests at once, each drawing
up to ``max_tokens`` at temperature 1, once free and once under a json_schema grammar (an object
holding a list of integers, so that the output runs long). Prints tokens/s of each, their ratio,
and what the grammar costs per constrained token: the time in the mask step (llguidance's
bitmask and the logits' fill), measured by wrapping it (the raw logprobs come from the batched
sampler, as for a free request).
``bench_gateway.py --structured --json`` carries it.

    python benchmarks/bench_structured.py [--n 8] [--max-tokens 64] [--rounds 3] [--small]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import pearl.engines.torch.engine as torch_engine
from pearl.engines.base import GenerateRequest, SamplingParams
from pearl.engines.grammar import Grammar, schema_text
from pearl.engines.torch.engine import TorchEngine

SCHEMA = {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
          "required": ["xs"]}  # fmt: skip


def _timed(fn: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            spent[0] += time.perf_counter() - t0

    return wrapper


def _round(engine: TorchEngine, prompts: list[tuple[int, ...]], max_tokens: list[int], tag: str,
           grammar: Grammar | None) -> tuple[list[int], float]:  # fmt: skip
    t0 = time.perf_counter()
    futures = [
        engine.generate(GenerateRequest(rid=f"{tag}-{i}", input_ids=p, sampling=SamplingParams(
            max_new_tokens=m, temperature=1.0, seed=100 + i, grammar=grammar)))
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
    ]  # fmt: skip
    lengths = [len(f.result(600).output_ids) for f in futures]
    return lengths, time.perf_counter() - t0


def structured_ratio(n: int = 8, max_tokens: int = 64, prompt_len: int = 16,
                     rounds: int = 3) -> dict[str, float]:  # fmt: skip
    """Tokens/s of ``n`` json_schema requests over the same ``n`` unconstrained (same run)."""
    grammar = Grammar(kind="json", text=schema_text(SCHEMA))
    spent = [0.0]
    saved = torch_engine.masked
    torch_engine.masked = _timed(saved, spent)  # type: ignore[assignment]
    engine = TorchEngine(preset="tiny", kv_budget_bytes=256 << 20)
    engine.start()
    try:
        vocab = engine.vocab_size
        rates: dict[str, list[float]] = {"free": [], "json": [], "matched": []}
        json_tokens = json_s = mask_s = 0.0
        for r in range(rounds + 1):  # the first round warms up
            prompts = [tuple((7 * r + 13 * i + 3 * j + 1) % vocab for j in range(prompt_len))
                       for i in range(n)]  # fmt: skip
            lengths = [max_tokens] * n
            # matched: free again, each request cut at its constrained twin's length (the same
            # batch shape as json's, so their ratio is the grammar's own cost)
            for way in ("free", "json", "matched"):
                spent[0] = 0.0
                lengths, took = _round(engine, prompts, lengths if way == "matched" else
                                       [max_tokens] * n, f"{way}{r}",
                                       grammar if way == "json" else None)  # fmt: skip
                tokens = sum(lengths)
                if r:
                    rates[way].append(tokens / took)
                    if way == "json":
                        json_tokens, json_s, mask_s = (json_tokens + tokens, json_s + took,
                                                       mask_s + spent[0])  # fmt: skip
        free = sorted(rates["free"])[len(rates["free"]) // 2]
        constrained = sorted(rates["json"])[len(rates["json"]) // 2]
        matched = sorted(rates["matched"])[len(rates["matched"]) // 2]
        return {"free_tokens_per_s": free, "json_tokens_per_s": constrained,
                "structured_ratio": constrained / free,
                "matched_free_tokens_per_s": matched,
                "matched_structured_ratio": constrained / matched,
                "json_tokens_per_request": json_tokens / (rounds * n),
                "mask_share": mask_s / json_s,
                "mask_ms_per_step": 1e3 * mask_s * n / json_tokens}  # fmt: skip
    finally:
        engine.stop()
        torch_engine.masked = saved  # type: ignore[assignment]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="4 requests of 16 tokens, 1 round")
    a = ap.parse_args()
    if a.small:
        a.n, a.max_tokens, a.rounds = 4, 16, 1
    print(json.dumps(structured_ratio(a.n, a.max_tokens, a.prompt, a.rounds), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
