"""Structured outputs in the in-process engines: every output parses, a migrated request
finishes under its grammar from the state its kept prefix left."""

from __future__ import annotations

import json
import time

import pytest

from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams
from pearl.engines.grammar import Grammar
from pearl.engines.sim import SimEngine
from pearl.engines.torch.engine import TorchEngine
from pearl.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
SCHEMA = {"type": "object", "required": ["city", "n", "ok"],
          "properties": {"city": {"type": "string"}, "n": {"type": "integer"},
                         "ok": {"type": "boolean"}}}  # fmt: skip
JSON = Grammar(kind="json", text=json.dumps(SCHEMA))


def request(
    rid: str, ids: tuple[int, ...], left: int, seed: int, generated: int = 0
) -> GenerateRequest:
    sp = SamplingParams(max_new_tokens=left, temperature=1.0, seed=seed,
                        stop_ids=(TOK.eos_id,), grammar=JSON)  # fmt: skip
    return GenerateRequest(rid=rid, input_ids=ids, sampling=sp, generated=generated)


@pytest.mark.parametrize("kind", [TorchEngine, SimEngine])
def test_random_weights_under_a_json_schema_always_parse(kind: type) -> None:
    e = kind()
    e.start()
    try:
        prompt = tuple(TOK.encode("A city:"))
        futs = [e.generate(request(f"r{i}", prompt, 400, i)) for i in range(8)]
        for f in futs:
            r = f.result(120)
            assert r.finish_reason is FinishReason.STOP
            assert {"city", "n", "ok"} <= set(json.loads(TOK.decode(r.output_ids)))
    finally:
        e.stop()


def test_a_reclaimed_constrained_request_resumes_under_its_grammar_elsewhere() -> None:
    """As the rollout client resubmits it: prompt + kept prefix, ``generated`` = the prefix."""
    a, b = TorchEngine(), TorchEngine(seed=1)  # another worker: other (random) weights
    a.start()
    b.start()
    try:
        prompt = tuple(TOK.encode("A city:"))
        fut = a.generate(request("m", prompt, 400, 3))
        time.sleep(0.05)
        a.abort("m")
        first = fut.result(60)
        kept = first.output_ids
        if first.finish_reason is FinishReason.ABORT:
            assert TOK.decode(kept).startswith('{"') or len(kept) < 2
            rest = b.generate(request("m", prompt + kept, 400 - len(kept), 4, len(kept)))
            kept += rest.result(120).output_ids
        assert {"city", "n", "ok"} <= set(json.loads(TOK.decode(kept)))
    finally:
        a.stop()
        b.stop()
