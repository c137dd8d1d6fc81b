"""One conformance suite for every engine (torch tiny, sim): the contract of pearl.engines.base."""

from __future__ import annotations

import time

import pytest

from pearl.core.state import Role
from pearl.engines.base import (
    Engine,
    EngineError,
    FinishReason,
    GenerateRequest,
    KVTimeout,
    SamplingParams,
)
from pearl.testing.wait import wait_until

from .helpers import Engines, new_weights, prompt_of, run

LONG = 3000  # tokens: seconds of generation on either engine, so an abort lands mid-way


def wait_decoding(engine: Engine, tokens: int = 5, timeout: float = 20.0) -> None:
    """Block until the engine ran ``tokens`` decode iterations (read from its telemetry)."""
    seen = [0]

    def decoded() -> bool:
        seen[0] += sum(1 for it in engine.telemetry().iterations if it.decode_batch)
        return seen[0] >= tokens

    wait_until(decoded, timeout, f"{tokens} decode iterations", every=0.005)


def test_generation_respects_max_new_tokens(engines: Engines) -> None:
    e = engines.make()
    r = run(e, prompt_of(20), max_new_tokens=9)
    assert len(r.output_ids) == 9 and len(r.logprobs) == 9
    assert r.finish_reason is FinishReason.LENGTH
    assert r.prompt_tokens == 20 and r.weights_version == 0
    assert all(lp <= 0 for lp in r.logprobs)
    assert run(e, prompt_of(20), rid="again", max_new_tokens=9).output_ids == r.output_ids


def test_stop_ids_end_generation_at_the_first_stop(engines: Engines) -> None:
    e = engines.make()
    full = run(e, prompt_of(30, 1), max_new_tokens=16).output_ids
    stop = full[5]
    r = run(e, prompt_of(30, 1), rid="s", max_new_tokens=16, stop_ids=(stop,))
    assert r.finish_reason is FinishReason.STOP
    assert r.output_ids == full[: full.index(stop) + 1]


def test_logprobs_can_be_left_out(engines: Engines) -> None:
    e = engines.make()
    sp = SamplingParams(max_new_tokens=4)
    req = GenerateRequest(rid="n", input_ids=prompt_of(8), sampling=sp, return_logprobs=False)
    assert e.generate(req).result(30).logprobs == ()


def test_seeded_sampling_is_reproducible(engines: Engines) -> None:
    e = engines.make()
    outs = [
        run(e, prompt_of(12), rid=f"s{i}", max_new_tokens=24, temperature=1.0, seed=seed).output_ids
        for i, seed in enumerate((1, 1, 2))
    ]
    assert outs[0] == outs[1] != outs[2]


def test_paused_generation_holds_requests_in_flight_until_continued(engines: Engines) -> None:
    e = engines.make()
    e.pause_generation()
    sp = SamplingParams(max_new_tokens=4)
    held = e.generate(GenerateRequest(rid="held", input_ids=prompt_of(8), sampling=sp))
    other = e.generate(GenerateRequest(rid="other", input_ids=prompt_of(9), sampling=sp))
    e.abort("held")
    r = held.result(30)  # the abort was handled; no iteration ran before or since
    assert r.finish_reason is FinishReason.ABORT and len(r.output_ids) == 0
    assert not other.done() and e.in_flight() == ["other"]
    e.continue_generation()
    assert len(other.result(30).output_ids) == 4


def test_abort_returns_the_generated_prefix(engines: Engines) -> None:
    e = engines.make()
    prompt = prompt_of(10, 2)
    fut = e.generate(
        GenerateRequest(rid="long", input_ids=prompt, sampling=SamplingParams(max_new_tokens=LONG))
    )
    wait_decoding(e)
    e.abort("long")
    r = fut.result(30)
    assert r.finish_reason is FinishReason.ABORT
    assert 0 < len(r.output_ids) < LONG and len(r.logprobs) == len(r.output_ids)
    assert e.in_flight() == []
    again = run(e, prompt, rid="ref", max_new_tokens=len(r.output_ids))
    assert again.output_ids == r.output_ids  # the prefix is what greedy generation produces
    e.abort("nobody")  # unknown ids are ignored


def test_release_resume_keeps_serving_at_the_same_version(engines: Engines) -> None:
    e = engines.make()
    before = run(e, prompt_of(16), max_new_tokens=8)
    e.release_memory()
    with pytest.raises(EngineError, match="resume_memory"):
        e.generate(GenerateRequest(rid="x", input_ids=prompt_of(16)))
    e.resume_memory()
    after = run(e, prompt_of(16), rid="after", max_new_tokens=8)
    assert after.output_ids == before.output_ids and after.weights_version == 0


def test_release_aborts_in_flight_requests_with_their_prefix(engines: Engines) -> None:
    e = engines.make()
    fut = e.generate(
        GenerateRequest(
            rid="long", input_ids=prompt_of(10), sampling=SamplingParams(max_new_tokens=LONG)
        )
    )
    wait_decoding(e)
    e.release_memory()
    r = fut.result(5)
    assert r.finish_reason is FinishReason.ABORT and 0 < len(r.output_ids) < LONG
    e.resume_memory()
    assert len(run(e, prompt_of(5), rid="b", max_new_tokens=3).output_ids) == 3


def test_weight_update_changes_output_and_version(engines: Engines) -> None:
    e = engines.make()
    old = run(e, prompt_of(24), max_new_tokens=12)
    e.load_weights(1, new_weights(engines.kind, seed=1))
    assert e.weights_version == 1
    new = run(e, prompt_of(24), rid="new", max_new_tokens=12)
    assert new.weights_version == 1 and new.output_ids != old.output_ids
    with pytest.raises(EngineError, match="older"):
        e.load_weights(0, new_weights(engines.kind, seed=0))
    assert e.weights_version == 1


def test_weights_loaded_while_released_apply_on_resume(engines: Engines) -> None:
    ref = engines.make()
    ref.load_weights(3, new_weights(engines.kind, seed=3))
    expected = run(ref, prompt_of(14), max_new_tokens=6).output_ids
    e = engines.make()
    e.release_memory()
    e.load_weights(3, new_weights(engines.kind, seed=3))
    e.resume_memory()
    r = run(e, prompt_of(14), max_new_tokens=6)
    assert r.weights_version == 3 and r.output_ids == expected


def test_disaggregated_generation_matches_colocated(engines: Engines) -> None:
    coloc = engines.make()
    prefill = engines.make(Role.PREFILL)
    decode = engines.make(Role.DECODE)
    peer = decode.kv_channel.address  # type: ignore[attr-defined]
    for i, n in enumerate((1, 17, 90)):
        prompt = prompt_of(n, i)
        want = run(coloc, prompt, rid=f"c{i}", max_new_tokens=10)
        sp = SamplingParams(max_new_tokens=10)
        fd = decode.generate(
            GenerateRequest(rid=f"r{i}", input_ids=prompt, sampling=sp, transfer_id=f"t{i}")
        )
        rp = prefill.generate(
            GenerateRequest(
                rid=f"r{i}", input_ids=prompt, sampling=sp, transfer_id=f"t{i}", kv_peer=peer
            )
        ).result(30)
        assert rp.finish_reason is FinishReason.PREFILLED
        assert rp.output_ids == want.output_ids[:1]
        rd = fd.result(30)
        assert rd.output_ids == want.output_ids and rd.finish_reason is FinishReason.LENGTH
        assert rd.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    sent = prefill.telemetry().transfers
    got = decode.telemetry().transfers
    assert [t.direction for t in sent] == ["send"] * 3
    assert [t.direction for t in got] == ["recv"] * 3
    assert [t.bytes for t in sent] == [t.bytes for t in got] and all(t.bytes > 0 for t in got)
    assert all(it.prefill_tokens == 0 for it in decode.telemetry().iterations)


def test_kv_may_arrive_before_the_decode_request(engines: Engines) -> None:
    prefill = engines.make(Role.PREFILL)
    decode = engines.make(Role.DECODE)
    coloc = engines.make()
    prompt, sp = prompt_of(33), SamplingParams(max_new_tokens=6)
    peer = decode.kv_channel.address  # type: ignore[attr-defined]
    # The prefill answers once its KV is sent: before the decode request exists.
    prefill.generate(
        GenerateRequest(rid="r", input_ids=prompt, sampling=sp, transfer_id="early", kv_peer=peer)
    ).result(30)
    rd = decode.generate(
        GenerateRequest(rid="r", input_ids=prompt, sampling=sp, transfer_id="early")
    ).result(30)
    assert rd.output_ids == run(coloc, prompt, max_new_tokens=6).output_ids


def test_decode_without_kv_times_out(engines: Engines) -> None:
    decode = engines.make(Role.DECODE, kv_timeout_s=0.3)
    t0 = time.monotonic()
    fut = decode.generate(
        GenerateRequest(rid="lost", input_ids=prompt_of(8), transfer_id="never-sent")
    )
    with pytest.raises(KVTimeout, match="never-sent"):
        fut.result(10)
    assert 0.25 < time.monotonic() - t0 < 5
    assert decode.in_flight() == []


def test_roles_check_their_requests(engines: Engines) -> None:
    prefill = engines.make(Role.PREFILL)
    with pytest.raises(EngineError, match="kv_peer"):
        prefill.generate(GenerateRequest(rid="p", input_ids=prompt_of(4), transfer_id="t"))
    decode = engines.make(Role.DECODE)
    with pytest.raises(EngineError, match="transfer_id"):
        decode.generate(GenerateRequest(rid="d", input_ids=prompt_of(4)))
    with pytest.raises(EngineError, match="kv_channel"):
        engines.make(Role.PREFILL, kv_channel=None, start=False)


def test_set_role_requires_an_idle_engine(engines: Engines) -> None:
    e = engines.make(kv_channel=engines.channel())
    fut = e.generate(
        GenerateRequest(
            rid="long", input_ids=prompt_of(6), sampling=SamplingParams(max_new_tokens=LONG)
        )
    )
    wait_decoding(e, 2)
    with pytest.raises(EngineError, match="drain"):
        e.set_role(Role.DECODE)
    assert e.role is Role.COLOCATED
    e.abort_all()
    assert fut.result(10).finish_reason is FinishReason.ABORT
    e.set_role(Role.DECODE)
    assert e.role is Role.DECODE
    with pytest.raises(EngineError):
        e.set_role(Role.TRAINING)


def test_drain_waits_for_in_flight_requests(engines: Engines) -> None:
    e = engines.make()
    fut = e.generate(
        GenerateRequest(
            rid="long", input_ids=prompt_of(6), sampling=SamplingParams(max_new_tokens=LONG)
        )
    )
    assert e.drain(0.05) is False and e.in_flight() == ["long"]
    e.abort("long")
    assert e.drain(10) is True and fut.result(1).finish_reason is FinishReason.ABORT
    fut2 = e.generate(
        GenerateRequest(
            rid="short", input_ids=prompt_of(6), sampling=SamplingParams(max_new_tokens=3)
        )
    )
    assert e.drain(30) is True and fut2.done()


def test_malformed_requests_are_refused(engines: Engines) -> None:
    e = engines.make()
    with pytest.raises(EngineError, match="empty"):
        e.generate(GenerateRequest(rid="e", input_ids=()))
    with pytest.raises(EngineError, match="max_new_tokens"):
        e.generate(
            GenerateRequest(rid="m", input_ids=(1, 2), sampling=SamplingParams(max_new_tokens=0))
        )
    fut = e.generate(
        GenerateRequest(
            rid="dup", input_ids=prompt_of(4), sampling=SamplingParams(max_new_tokens=LONG)
        )
    )
    with pytest.raises(EngineError, match="already in flight"):
        e.generate(GenerateRequest(rid="dup", input_ids=prompt_of(4)))
    e.abort("dup")
    fut.result(10)


def test_telemetry_reports_iterations_once(engines: Engines) -> None:
    e = engines.make()
    e.telemetry()
    run(e, prompt_of(40), max_new_tokens=5)
    its = e.telemetry().iterations
    assert sum(it.prefill_tokens for it in its) == 40
    assert sum(it.decode_batch for it in its) == 4  # the first token comes from the prefill
    assert all(it.duration_s > 0 for it in its)
    assert e.telemetry().iterations == ()


def test_stop_is_idempotent_and_final(engines: Engines) -> None:
    e = engines.make()
    fut = e.generate(
        GenerateRequest(
            rid="long", input_ids=prompt_of(6), sampling=SamplingParams(max_new_tokens=LONG)
        )
    )
    e.stop()
    e.stop()
    assert fut.result(5).finish_reason is FinishReason.ABORT
    with pytest.raises(EngineError, match="not running"):
        e.generate(GenerateRequest(rid="x", input_ids=prompt_of(3)))
