"""vLLM's sampling fields, top logprobs and n samples on the torch and sim engines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from pearl.engines.base import GenerateRequest, GenerateResult, SamplingParams
from pearl.engines.sim import SimEngine
from pearl.engines.torch.engine import TorchEngine

PROMPT = tuple(range(5, 45))


@pytest.fixture(scope="module")
def torch_engine() -> Iterator[TorchEngine]:
    e = TorchEngine(preset="tiny")
    e.start()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def sim_engine() -> Iterator[SimEngine]:
    e = SimEngine(time_scale=1e-6)
    e.start()
    yield e
    e.stop()


def run(engine: TorchEngine | SimEngine, *reqs: GenerateRequest) -> list[GenerateResult]:
    futures = [engine.generate(r) for r in reqs]
    return [f.result(120) for f in futures]


def req(rid: str, **sampling: object) -> GenerateRequest:
    top = int(sampling.pop("top", 0))  # type: ignore[call-overload]
    group = str(sampling.pop("group", ""))
    sp = SamplingParams(**{"max_new_tokens": 8, **sampling})  # type: ignore[arg-type]
    return GenerateRequest(rid=rid, input_ids=PROMPT, sampling=sp, top_logprobs=top, group=group)


@pytest.mark.parametrize("kind", ["torch", "sim"])
def test_n_samples_of_a_group_equal_single_requests_with_seeds_s_plus_i(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """The gateway's rule: sample i of ``n=8, seed=s`` uses seed s + i; a group (one prefill,
    K/V copied) gives what eight single requests give."""
    engine = request.getfixturevalue(f"{kind}_engine")
    singles = run(engine, *[req(f"{kind}-s{i}", temperature=1.0, seed=40 + i) for i in range(8)])
    group = run(
        engine, *[req(f"{kind}-g{i}", temperature=1.0, seed=40 + i, group=f"{kind}-G")
                  for i in range(8)]
    )  # fmt: skip
    for a, b in zip(singles, group, strict=True):
        assert a.output_ids == b.output_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert len({r.output_ids for r in group}) > 1  # the seeds differ
    if kind == "torch":  # the followers copied the leader's prefill
        assert sum(r.cached_tokens == len(PROMPT) - 1 for r in group) == 7


def test_top_logprobs_are_the_models_own_top_k(torch_engine: TorchEngine) -> None:
    (r,) = run(torch_engine, req("top", top=5, max_new_tokens=4))
    model = torch_engine.model
    ids = torch.tensor([list(PROMPT) + list(r.output_ids)])
    with torch.inference_mode():
        logits = model(ids).logits[0].float()
    lps = torch.log_softmax(logits, -1)
    for k, top in enumerate(r.top_logprobs):
        want = torch.topk(lps[len(PROMPT) - 1 + k], 5)
        assert [t for t, _ in top] == want.indices.tolist()
        assert [lp for _, lp in top] == pytest.approx(want.values.tolist(), abs=1e-4)
        assert top[0][0] == r.output_ids[k]  # greedy: the most likely


@pytest.mark.parametrize("kind", ["torch", "sim"])
def test_sampling_fields_change_the_output_as_vllms_do(
    kind: str, request: pytest.FixtureRequest
) -> None:
    engine = request.getfixturevalue(f"{kind}_engine")
    (forced,) = run(engine, req(f"{kind}-bias", logit_bias=((7, 100.0),)))
    assert forced.output_ids == (7,) * 8  # logit_bias +100 forces a token
    # (top=1: the sim draws from its explicit distribution, as with the fields)
    (greedy,) = run(engine, req(f"{kind}-greedy", top=1))
    (k1,) = run(engine, req(f"{kind}-k1", temperature=1.0, top_k=1, seed=3))
    assert k1.output_ids == greedy.output_ids  # top_k=1 is greedy
    first = greedy.output_ids[0]
    (stop,) = run(engine, req(f"{kind}-stop", stop_ids=(first,), top=1))
    assert stop.output_ids == (first,) and stop.finish_reason == "stop"
    (late,) = run(engine, req(f"{kind}-min", stop_ids=(first,), min_tokens=4))
    assert len(late.output_ids) >= 4 and first not in late.output_ids[:3]  # EOS suppressed
    (rep,) = run(engine, req(f"{kind}-rep", logit_bias=((7, 5.0),), presence_penalty=2.0,
                             frequency_penalty=2.0, repetition_penalty=2.0))  # fmt: skip
    assert rep.output_ids != (7,) * 8  # the penalties stop the repetition
    noop = req(f"{kind}-noop", top_k=-1, repetition_penalty=1.0, min_p=0.0, top=1)
    assert run(engine, noop)[0].output_ids == greedy.output_ids  # no-op values change nothing


@pytest.mark.parametrize("kind", ["torch", "sim"])
def test_a_temperature_near_zero_is_greedy(
    kind: str, torch_engine: TorchEngine, sim_engine: SimEngine
) -> None:
    """A denormal temperature (4e-256: found by the gateway's fuzz) would make logits / t
    infinite and the draw fail: below GREEDY_BELOW it is greedy, as in vLLM."""
    engine = torch_engine if kind == "torch" else sim_engine
    greedy, tiny, below = run(
        engine,
        req(f"{kind}-g", temperature=0.0),
        req(f"{kind}-t", temperature=4.179346457584668e-256, seed=3),
        req(f"{kind}-b", temperature=9e-6),
    )
    assert tiny.output_ids == greedy.output_ids == below.output_ids
