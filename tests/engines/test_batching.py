"""Continuous batching: many concurrent requests, batched == unbatched greedy, chunked prefill."""

from __future__ import annotations

import random

import pytest

from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams
from pearl.testing.wait import wait_until

from .helpers import Engines, prompt_of, run


def mixed_requests(n: int, seed: int = 0) -> list[GenerateRequest]:
    rng = random.Random(seed)
    return [
        GenerateRequest(
            rid=f"q{i}",
            input_ids=prompt_of(rng.randint(1, 160), i),
            sampling=SamplingParams(max_new_tokens=rng.randint(1, 24)),
        )
        for i in range(n)
    ]


def test_many_concurrent_requests_complete_and_match_unbatched(engines: Engines) -> None:
    reqs = mixed_requests(64)
    solo = engines.make()
    alone = {r.rid: solo.generate(r).result(60) for r in reqs}  # one at a time
    e = engines.make(token_budget=128)
    futs = [e.generate(r) for r in reqs]
    results = [f.result(120) for f in futs]
    assert e.in_flight() == []
    for req, res in zip(reqs, results, strict=True):
        assert res.rid == req.rid and res.finish_reason is FinishReason.LENGTH
        assert len(res.output_ids) == req.sampling.max_new_tokens
        assert res.output_ids == alone[req.rid].output_ids, req.rid
    its = e.telemetry().iterations
    assert max(it.decode_batch for it in its) >= 16  # they really ran batched
    assert sum(it.prefill_tokens for it in its) == sum(len(r.input_ids) for r in reqs)
    # Each result says which batches its decode shared: the first token comes from the prefill,
    # every other from one decode iteration, and those iterations add up to the engine's.
    for res in results:
        assert res.decode_steps == len(res.output_ids) - 1
        assert res.decode_steps <= res.decode_batch_sum <= res.decode_steps * len(reqs)
    assert sum(r.decode_batch_sum for r in results) == sum(
        it.decode_batch * it.decode_batch for it in its
    )


def test_chunked_prefill_interleaves_with_decode(engines: Engines) -> None:
    e = engines.make(token_budget=32)
    short = e.generate(
        GenerateRequest(
            rid="short", input_ids=prompt_of(4), sampling=SamplingParams(max_new_tokens=400)
        )
    )
    wait_until(
        lambda: any(it.decode_batch for it in e.telemetry().iterations),
        30,
        "a decode iteration",
        every=0.001,
    )
    long = run(e, prompt_of(300, 3), rid="long", max_new_tokens=2)
    its = e.telemetry().iterations
    assert all(it.prefill_tokens + it.decode_batch <= 32 for it in its)
    mixed = [it for it in its if it.prefill_tokens and it.decode_batch]
    assert len(mixed) >= 300 // 32  # the long prompt went in chunks beside the decoding request
    e.abort("short")
    assert short.result(10).finish_reason is FinishReason.ABORT
    assert long.output_ids == run(engines.make(), prompt_of(300, 3), max_new_tokens=2).output_ids


def test_preemption_under_memory_pressure_loses_nothing(engines: Engines) -> None:
    reqs = [
        GenerateRequest(
            rid=f"p{i}", input_ids=prompt_of(40, i), sampling=SamplingParams(max_new_tokens=40)
        )
        for i in range(8)
    ]
    ref = engines.make()
    want = {r.rid: ref.generate(r).result(60).output_ids for r in reqs}
    per_page = ref.kv_usage()["bytes_per_page"]  # type: ignore[attr-defined]
    e = engines.make(kv_budget_bytes=per_page * 14)  # 8 x 80 tokens need 40 pages; 14 exist
    results = [f.result(120) for f in [e.generate(r) for r in reqs]]
    assert e.kv_usage()["preemptions"] > 0  # type: ignore[attr-defined]
    assert {r.rid: r.output_ids for r in results} == want


def test_a_request_larger_than_the_pool_fails_clearly(engines: Engines) -> None:
    ref = engines.make()
    per_page = ref.kv_usage()["bytes_per_page"]  # type: ignore[attr-defined]
    e = engines.make(kv_budget_bytes=per_page * 4)
    fut = e.generate(
        GenerateRequest(
            rid="big", input_ids=prompt_of(100), sampling=SamplingParams(max_new_tokens=2)
        )
    )
    with pytest.raises(Exception, match="kv_budget_bytes"):
        fut.result(10)
    r = run(e, prompt_of(30), rid="grows", max_new_tokens=60)  # 90 tokens > 64 in the pool
    assert r.finish_reason is FinishReason.LENGTH and 0 < len(r.output_ids) < 60
