"""The vLLM engine against a real vLLM server (CPU build, from ``.venv-vllm``): generation is
vLLM's own, an abort keeps the prefix and its continuation equals the unmigrated run, published
weights are served without a restart (and equal ``transformers``' forward with them), a lend
pauses the server. Under PEARL's Router, WorkerActor and RolloutClient: a request the server
refuses reaches it exactly once and fails as refused, never retried; a server SIGKILLed under 16
requests in flight is relaunched at the current weights, and every request completes, resumed
with its prefix, equal to its uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from actors import names
from actors.base import Directory, LocalRef, start
from actors.messages import StateChanged
from actors.rollout_client import RolloutClient
from actors.router import Flush, Router
from actors.worker import WorkerActor
from pearl.core.errors import RequestRefused
from pearl.core.state import Activity, Role, Worker, Zone
from pearl.core.view import ClusterView, TableSnapshot
from pearl.engines.base import EngineError, FinishReason, GenerateRequest, SamplingParams
from pearl.engines.grammar import Grammar, schema_text
from pearl.engines.vllm.engine import body
from pearl.engines.web import call

from ...daemon.conftest import wait_until

# One engine for the module; the pool's Router and WorkerActor live across its fault tests.
pytestmark = [pytest.mark.slow, pytest.mark.shared_actors, pytest.mark.timeout(900)]
WAIT_S = 600.0  # a relaunch on two busy cores takes a minute or more

PROMPT = (5, 17, 42, 99, 3, 250, 7, 64)


def greedy(rid: str, prompt: tuple[int, ...] = PROMPT, n: int = 24) -> GenerateRequest:
    return GenerateRequest(
        rid=rid, input_ids=prompt, sampling=SamplingParams(max_new_tokens=n, temperature=0.0)
    )


def test_generation_through_the_engine_is_the_servers_own(engine: Any) -> None:
    out = engine.generate(greedy("g1")).result(120)
    assert out.finish_reason is FinishReason.LENGTH and len(out.output_ids) == 24
    assert len(out.logprobs) == 24 and all(lp <= 0.0 for lp in out.logprobs)
    direct = call(
        engine.client.base + "/v1/completions",
        "POST",
        {**body(greedy("d1")), "stream_options": None},
        timeout_s=120,
    )
    assert tuple(direct["choices"][0]["token_ids"]) == out.output_ids
    assert out.prompt_tokens == len(PROMPT) and out.weights_version == engine.weights_version


def test_stop_ids_end_a_request_and_nothing_else_does(engine: Any) -> None:
    ref = engine.generate(greedy("s0")).result(120).output_ids
    stop = ref[5]
    req = GenerateRequest(
        rid="s1",
        input_ids=PROMPT,
        sampling=SamplingParams(max_new_tokens=24, temperature=0.0, stop_ids=(stop,)),
    )
    out = engine.generate(req).result(120)
    first = ref.index(stop)
    assert out.finish_reason is FinishReason.STOP and out.output_ids == ref[: first + 1]


def test_an_abort_keeps_the_prefix_and_the_rest_continues_it_exactly(engine: Any) -> None:
    """What a reclaim does to a turn: aborted mid-generation, its prefix kept; resumed (here on
    the same server, as on any other) from prompt + prefix, the tokens equal the run that was
    never interrupted."""
    n = 200
    whole = engine.generate(greedy("u", n=n)).result(300).output_ids
    fut = engine.generate(greedy("a", n=n))

    def streamed() -> int:
        c = engine._calls.get("a")
        return bool(c and c.completion and len(c.completion.out.token_ids) >= 4)

    wait_until(streamed, 120, "the first tokens of the request")
    engine.abort("a")
    cut = fut.result(60)
    assert cut.finish_reason is FinishReason.ABORT
    k = len(cut.output_ids)
    assert 4 <= k < n and cut.output_ids == whole[:k] and len(cut.logprobs) == k
    rest = engine.generate(greedy("r", PROMPT + cut.output_ids, n - k)).result(300)
    assert cut.output_ids + rest.output_ids == whole
    assert not engine.in_flight()


def test_a_lend_pauses_the_server_and_the_return_serves_again(engine: Any) -> None:
    engine.release_memory()
    with pytest.raises(EngineError, match="released its memory"):
        engine.generate(greedy("x"))
    engine.resume_memory()
    assert engine.generate(greedy("after")).result(120).output_ids


def test_published_weights_are_served_in_place_and_equal_transformers(
    engine: Any, tiny_model: Path, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3ForCausalLM

    before = engine.generate(greedy("w0", n=8)).result(120).output_ids
    pid = engine.server.pid
    model = Qwen3ForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    snap = tmp_path / "v3.safetensors"
    tensors = model.state_dict()
    tensors.pop("lm_head.weight")  # tied to the embeddings, as the checkpoint has it
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(snap))
    engine.load_weights(3, str(snap))
    out = engine.generate(greedy("w1", n=8)).result(120)
    assert engine.server.pid == pid  # no restart
    assert (
        out.weights_version == 3
        and call(engine.client.base + "/weight_info")["weight_version"] == "3"
    )
    ids = torch.tensor([list(PROMPT)])
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)[0]
    assert out.output_ids == tuple(ref[len(PROMPT) :].tolist())
    assert out.output_ids != before
    with pytest.raises(EngineError, match="older than the loaded version 3"):
        engine.load_weights(2, str(snap))


def test_telemetry_comes_from_the_servers_metrics(engine: Any) -> None:
    engine.telemetry()
    for k in range(3):
        engine.generate(greedy(f"t{k}", n=16)).result(120)
    tel = engine.telemetry()
    decode = [it for it in tel.iterations if it.decode_batch]
    assert decode and all(0 < it.duration_s < 10 for it in decode)


def prompt(i: int) -> tuple[int, ...]:
    return tuple((7 * i + 13 * k) % 250 + 1 for k in range(6 + i))


@pytest.fixture(scope="module")
def pool(engine: Any) -> Iterator[RolloutClient]:
    """The engine as worker 0 of a one-worker pool, routed by a real Router."""
    d = Directory()
    start(d, Router, directory=d, link=None, wait_s=WAIT_S)
    ref = WorkerActor.start(d, 0, 1, lambda role: engine, lambda v: None, lambda: None)
    d.register(LocalRef(names.worker_name(0), ref))
    ref.proxy().engine = engine
    w = Worker(
        id=0,
        gpus=(0,),
        role=Role.COLOCATED,
        activity=Activity.ACTIVE,
        zone=Zone.DEDICATED,
        incarnation=1,
    )
    d.tell(names.ROUTER, StateChanged(view=ClusterView(table=TableSnapshot(seq=1, workers=(w,)))))
    client = RolloutClient(d, wait_s=WAIT_S)
    stop = threading.Event()

    def tick() -> None:  # pearld's ticker: the Router routes what waits at each tick
        while not stop.wait(0.2):
            d.tell(names.ROUTER, Flush())

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield client
    finally:
        stop.set()
        ticker.join()
        client.close()
        d.get(names.ROUTER).ref.stop()
        ref.proxy().engine = None  # the engine fixture stops it
        ref.stop()
        pykka.ActorRegistry.stop_all(timeout=10)


def completions_posted(engine: Any) -> int:
    """Requests the server has answered on /v1/completions, from its access log."""
    text = Path(engine.cfg.log_path).read_text(errors="replace")
    return len(re.findall(r'"POST /v1/completions HTTP/1\.1" \d+', text))


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=4, stop_ids=(999_999,)),  # refused inside a 200 stream
        SamplingParams(max_new_tokens=4000),  # refused with a 400 status: beyond max_model_len
    ],
    ids=["in-stream", "status"],
)
def test_a_refused_request_reaches_the_server_once_and_fails_as_refused(
    engine: Any, pool: RolloutClient, sampling: SamplingParams
) -> None:
    before = completions_posted(engine)
    fut = pool.generate(
        GenerateRequest(
            rid=f"poison-{sampling.max_new_tokens}", input_ids=(5, 6), sampling=sampling
        )
    )
    with pytest.raises(RequestRefused, match="refused the request \\(400\\)"):
        fut.result(120)
    rid = f"after-{sampling.max_new_tokens}"
    ok = pool.generate(
        GenerateRequest(rid=rid, input_ids=(5, 6), sampling=SamplingParams(max_new_tokens=4))
    )
    assert len(ok.result(120).output_ids) == 4  # the server serves on
    wait_until(lambda: completions_posted(engine) >= before + 2, 30, "the access log")
    assert completions_posted(engine) == before + 2  # the refused one once, and the good one


def test_a_killed_server_is_relaunched_at_the_current_weights_and_fails_none_of_16_requests(
    engine: Any, pool: RolloutClient
) -> None:
    """SIGKILL under 16 requests in flight: the server is relaunched at the weights version it
    served (published in place above, not the checkpoint's), and every request completes,
    resumed with its prefix, equal to its uninterrupted run."""
    version = engine.weights_version
    before = engine.generate(greedy("k-before", n=8)).result(120).output_ids
    n = 48
    sp = SamplingParams(max_new_tokens=n)
    whole = {
        f"u{i}": engine.generate(GenerateRequest(rid=f"u{i}", input_ids=prompt(i), sampling=sp))
        for i in range(16)
    }
    reference = {rid[1:]: f.result(300).output_ids for rid, f in whole.items()}
    futs = {f"{i}": pool.generate(GenerateRequest(rid=f"k{i}", input_ids=prompt(i), sampling=sp))
            for i in range(16)}  # fmt: skip

    def streaming() -> bool:
        calls = list(engine._calls.values())
        return sum(1 for c in calls if c.completion and len(c.completion.out.token_ids) >= 2) >= 8

    wait_until(streaming, 120, "tokens of most of the 16 requests")
    old = engine.server.pid
    os.kill(old, signal.SIGKILL)
    failed, resumed = [], 0
    for i, f in futs.items():
        try:
            out = f.result(WAIT_S)
        except Exception as e:  # counted: the figure is how many failed
            failed.append(f"k{i}: {e}")
            continue
        assert out.finish_reason is FinishReason.LENGTH
        assert tuple(out.output_ids) == reference[i]  # resumed with its prefix, nothing lost
        resumed += out.resumed > 0
    assert failed == [] and engine.server.pid != old
    assert resumed >= 8  # they ran on the dead server and resumed on its relaunch
    wait_until(lambda: engine.accepting, WAIT_S, "the relaunch to finish")
    out = engine.generate(greedy("k-after", n=8)).result(120)
    assert out.output_ids == before and out.weights_version == version


# -- structured outputs: PEARL's grammar processor in the server (issue 43) --------------------

OBJECT = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
# Forty answers: long enough for an abort to land mid-way, and a language so bounded that even
# random weights end it well-formed (at EOS) long before the budget.
ANSWERS = {"type": "array", "items": {"enum": ["yes", "no"]}, "minItems": 40, "maxItems": 40}


def constrained(
    rid: str, g: Grammar, eos: int, prompt: tuple[int, ...] = PROMPT, generated: int = 0,
    temperature: float = 0.0, seed: int | None = None,
) -> GenerateRequest:  # fmt: skip
    sampling = SamplingParams(max_new_tokens=400, temperature=temperature, seed=seed,
                              stop_ids=(eos,), grammar=g)  # fmt: skip
    return GenerateRequest(rid=rid, input_ids=prompt, sampling=sampling, generated=generated)


def text_of(tok: Any, ids: tuple[int, ...]) -> str:
    """The output's text without its final EOS."""
    assert ids and ids[-1] == tok.eos_token_id, ids[-8:]
    return str(tok.decode(list(ids[:-1])))


def test_structured_requests_parse_under_the_servers_grammar(engine: Any, tiny_model: Path) -> None:
    """A JSON schema and a choice, greedy and sampled, from a model with random weights."""
    import jsonschema
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    schema = Grammar(kind="json", text=schema_text(OBJECT))
    choice = Grammar(kind="choice", text='["yes", "no", "maybe"]')
    eos = tok.eos_token_id
    for i, (t, seed) in enumerate([(0.0, None), (1.0, 1), (1.0, 2)]):
        out = engine.generate(constrained(f"j{i}", schema, eos, temperature=t, seed=seed))
        text = text_of(tok, out.result(120).output_ids)
        jsonschema.validate(json.loads(text), OBJECT)
        assert " " not in text  # compact, as the in-process engines decode JSON
        out = engine.generate(constrained(f"c{i}", choice, eos, temperature=t, seed=seed))
        assert text_of(tok, out.result(120).output_ids) in ("yes", "no", "maybe")


def test_a_constrained_request_resumes_its_grammar_from_the_kept_prefix(
    engine: Any, tiny_model: Path
) -> None:
    """What a reclaim does to a constrained turn: aborted mid-output, its prefix kept; resumed
    with the prefix as the prompt's last ``generated`` ids, the grammar goes on from the
    prefix's state: prefix + rest parses, and equals the run that was never interrupted."""
    import jsonschema
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    g = Grammar(kind="json", text=schema_text(ANSWERS))
    eos = tok.eos_token_id
    whole = engine.generate(constrained("gu", g, eos)).result(300).output_ids
    jsonschema.validate(json.loads(text_of(tok, whole)), ANSWERS)
    fut = engine.generate(constrained("ga", g, eos))

    def streamed() -> bool:
        c = engine._calls.get("ga")
        return bool(c and c.completion and len(c.completion.out.token_ids) >= 4)

    wait_until(streamed, 120, "the first tokens of the request")
    engine.abort("ga")
    cut = fut.result(60)
    assert cut.finish_reason is FinishReason.ABORT
    k = len(cut.output_ids)
    assert 4 <= k < len(whole) and cut.output_ids == whole[:k]
    rest = engine.generate(constrained("gr", g, eos, PROMPT + cut.output_ids, k)).result(300)
    assert rest.finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads(text_of(tok, cut.output_ids + rest.output_ids)), ANSWERS)
    assert cut.output_ids + rest.output_ids == whole
    assert not engine.in_flight()
