"""One bad request fails alone: refused at admission when it is malformed for the model, and
isolated in the batch when its model step fails anyway, while the requests beside it go on."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from pearl.core.errors import RequestRefused
from pearl.engines.base import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    check_request,
)
from pearl.engines.sequence import Segment, Seq
from pearl.engines.sim import SimEngine

from .helpers import Engines, prompt_of, run


def req(rid: str, ids: tuple[int, ...] = (1, 2, 3), **sampling: Any) -> GenerateRequest:
    return GenerateRequest(
        rid=rid, input_ids=ids, sampling=SamplingParams(**{"max_new_tokens": 4, **sampling})
    )


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (req("r", (1, 2**64)), "token id 18446744073709551616"),
        (req("r", (-1, 2)), "token id -1"),
        (req("r", stop_ids=(2**63,)), "stop_ids holds token id"),
        (req("r", seed=2**64), "seed 18446744073709551616"),
        (req("r", seed=-(2**63) - 1), "outside [-2**63, 2**63)"),
        (req("r", max_new_tokens=2**63), "max_new_tokens"),
        (req("r", temperature=float("nan")), "temperature"),
        (req("r", top_p=float("inf")), "top_p"),
        (req("\ud800"), "not valid text"),
        (
            GenerateRequest(rid="r", input_ids=(1,), trajectory="a\udfffb"),
            "trajectory is not valid text",
        ),
    ],
)
def test_a_request_that_cannot_cross_a_process_is_refused(
    request_: GenerateRequest, words: str
) -> None:
    with pytest.raises(RequestRefused) as e:
        check_request(request_)
    assert words in str(e.value)
    check_request(req("ok", (0, 2**63 - 1), seed=-(2**63), stop_ids=(7,)))  # the bounds pass


def test_ids_beyond_the_vocabulary_are_refused_at_admission(engines: Engines) -> None:
    e = engines.make()
    vocab = e.vocab_size  # type: ignore[attr-defined]
    assert vocab > 0
    with pytest.raises(RequestRefused, match=f"token id {vocab}, outside the vocabulary"):
        e.generate(req("in", (1, vocab)))
    with pytest.raises(RequestRefused, match="stop_ids holds token id"):
        e.generate(req("stop", stop_ids=(vocab + 5,)))
    assert e.in_flight() == []
    r = run(e, (1, vocab - 1), rid="edge", max_new_tokens=3)  # the last id is in
    assert r.finish_reason is FinishReason.LENGTH and len(r.output_ids) == 3


def test_a_poison_sequence_among_30_fails_alone_and_the_batch_goes_on(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt id beyond the embedding reaches the model (the admission check is off here):
    its step raises IndexError; the 30 requests batched with it finish as they would alone."""
    if engines.kind == "sim":  # no embedding: its step fails as the torch model's does
        forward = SimEngine._forward

        def embedding(self: SimEngine, segments: list[Segment]) -> list[tuple[int, float]]:
            if any(t >= self.cost.vocab_size for g in segments for t in g.seq.tokens):
                raise IndexError("index out of range in self")
            return forward(self, segments)

        monkeypatch.setattr(SimEngine, "_forward", embedding)
    reqs = [req(f"ok{i}", prompt_of(8 + i, i), max_new_tokens=6) for i in range(30)]
    alone = engines.make()
    want = {r.rid: run(alone, r.input_ids, rid=r.rid, max_new_tokens=6).output_ids for r in reqs}
    e = engines.make()
    vocab = e.vocab_size  # type: ignore[attr-defined]
    e.vocab_size = 0  # type: ignore[attr-defined]  # let the poison through to the model
    e.pause_generation()  # type: ignore[attr-defined]  # so that all 31 share the first step
    futs = [e.generate(r) for r in reqs[:15]]
    poison = e.generate(req("poison", (vocab + 88, 5), max_new_tokens=6))
    futs += [e.generate(r) for r in reqs[15:]]
    e.continue_generation()  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="model step failed: IndexError"):
        poison.result(60)
    results = [f.result(60) for f in futs]
    failed = [r.rid for r in reqs if r.rid not in {x.rid for x in results}]
    assert failed == []
    assert {x.rid: x.output_ids for x in results} == want
    assert max(it.decode_batch for it in e.telemetry().iterations) >= 20  # really batched
    assert e.in_flight() == []
    assert run(e, (1, 2, 3), rid="after", max_new_tokens=2).finish_reason is FinishReason.LENGTH


def test_a_sequence_its_backend_cannot_set_up_fails_alone(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engines.make()
    setup = type(e)._new_sequence

    def fragile(self: Any, seq: Seq) -> None:
        if seq.rid == "bad":
            raise OverflowError("seed out of range")
        setup(self, seq)

    monkeypatch.setattr(type(e), "_new_sequence", fragile)
    e.pause_generation()  # type: ignore[attr-defined]
    good: Future[GenerateResult] = e.generate(req("good", max_new_tokens=3))
    bad = e.generate(req("bad", max_new_tokens=3))
    e.continue_generation()  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="request bad: OverflowError"):
        bad.result(30)
    assert len(good.result(30).output_ids) == 3
    assert run(e, (4, 5), rid="next", max_new_tokens=2).finish_reason is FinishReason.LENGTH


def test_a_sequence_whose_end_check_raises_fails_alone(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deciding whether a sequence ends can raise (its output left its grammar): that request
    fails with the reason, and the engine's loop serves the next request."""
    e = engines.make()
    stop_reason = Seq.stop_reason

    def left_grammar(self: Seq, max_seq_len: int) -> FinishReason | None:
        if self.rid == "bad" and self.output:
            raise RequestRefused("the output left its grammar: token 7")
        return stop_reason(self, max_seq_len)

    monkeypatch.setattr(Seq, "stop_reason", left_grammar)
    e.pause_generation()  # type: ignore[attr-defined]
    good = e.generate(req("good", max_new_tokens=3))
    bad = e.generate(req("bad", max_new_tokens=3))
    e.continue_generation()  # type: ignore[attr-defined]
    with pytest.raises(RequestRefused, match="left its grammar"):
        bad.result(30)
    assert len(good.result(30).output_ids) == 3
    assert run(e, (4, 5), rid="next", max_new_tokens=2).finish_reason is FinishReason.LENGTH


def test_a_fault_of_the_loop_fails_what_is_in_flight_and_the_loop_goes_on(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engines.make()
    step = type(e)._step
    faults = iter([RuntimeError("scheduler bug")])

    def once(self: Any, sched: Any) -> None:
        if self._seqs:  # noqa: SLF001 - the fault needs a request in flight
            fault = next(faults, None)
            if fault is not None:
                raise fault
        step(self, sched)

    monkeypatch.setattr(type(e), "_step", once)
    with pytest.raises(Exception, match="engine step failed: RuntimeError: scheduler bug"):
        e.generate(req("hit", max_new_tokens=3)).result(30)
    assert e.in_flight() == []
    assert run(e, (4, 5), rid="next", max_new_tokens=2).finish_reason is FinishReason.LENGTH
