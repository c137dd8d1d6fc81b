"""A property-based fuzz of every gateway route against a real pearld (torch engine, tiny model):
whatever an authenticated client sends, the answer is never a 5xx (nor a stream's server error),
no worker host is restarted, no actor fails, and pearld stays up.

Bodies start from a valid request of the route and have some fields replaced by values chosen to
break a consumer: integers past every width an encoder or a tensor index takes, ids past the
vocabulary, non-finite and huge floats (JSON's ``NaN``/``Infinity``, which Python's parser
accepts), lone surrogates, deep or wrong-typed values; or are raw bytes. Hypothesis is
derandomized, so a failure is the same on every run and shrinks to its smallest body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pearl.gateway import protocol as p
from pearl.testing.pearld import ROOT, Pearld, free_port
from pearl.testing.wait import wait_until

pytestmark = pytest.mark.slow

KEY = "sk-fuzz"
MODEL = "pearl-fuzz"
CONTEXT = 256  # workload.max_trajectory_tokens: every generation ends quickly
ROUTES = ("/v1/chat/completions", "/v1/completions", "/generate")
FUZZ = settings(
    max_examples=160,
    deadline=None,
    derandomize=True,
    # A failure may leave pearld unable to answer: shrinking against it would crawl.
    phases=(Phase.explicit, Phase.generate),
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

BIG_INTS = (
    -(2**64), -(2**63) - 1, -(2**31), -1, 0, 1, 7, 255, 600, 9707, 151_643,
    2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**40,
)  # fmt: skip
ODD_FLOATS = (float("nan"), float("inf"), -float("inf"), -0.0, 1e-320, 1e308, -1e308, 2.5, 1e20)
ODD_TEXT = ("", "\ud800", "a\udfffb", "\x00", "<|im_end|>", "x" * 3000, "\u202e", "٣", "1_000")

ints = st.one_of(st.sampled_from(BIG_INTS), st.sampled_from(BIG_INTS), st.integers())
floats = st.one_of(st.sampled_from(ODD_FLOATS), st.floats())
texts = st.one_of(st.sampled_from(ODD_TEXT), st.text(max_size=30))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)
id_lists = st.lists(ints, min_size=0, max_size=6)


def base(route: str) -> dict[str, Any]:
    """A valid request of ``route``."""
    if route == "/v1/chat/completions":
        return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    if route == "/v1/completions":
        return {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    return {"text": "hello", "sampling_params": {"max_new_tokens": 4}}


def typed(annotation: Any) -> st.SearchStrategy[Any]:
    """Poison of a field's own type (so that it passes the schema and reaches a consumer)."""
    text = str(annotation)
    if "list[int]" in text:
        return id_lists
    if "int" in text:
        return ints
    if "float" in text:
        return floats
    if "bool" in text:
        return st.booleans()
    if "str" in text:
        return texts
    return values


def fields(model: type[p.BaseModel]) -> dict[str, st.SearchStrategy[Any]]:
    return {
        name: st.one_of(typed(f.annotation), typed(f.annotation), values)
        for name, f in model.model_fields.items()
    }


FIELDS = {
    "/v1/chat/completions": fields(p.ChatRequest),
    "/v1/completions": fields(p.CompletionRequest),
    "/generate": fields(p.GenerateRequest),
}
SAMPLING = fields(p.GenerateSamplingParams)


@st.composite
def bodies(draw: st.DrawFn, route: str) -> bytes:
    """A body for ``route``: a valid request with fields replaced, or raw bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=64))
    body = base(route)
    own = FIELDS[route]
    for key in draw(st.lists(st.sampled_from(sorted(own)), min_size=1, max_size=2)):
        body[key] = draw(own[key])
    if draw(st.integers(0, 5)) == 0:
        body[draw(texts)] = draw(values)
    if route == "/generate" and draw(st.booleans()):
        old = body.get("sampling_params")
        sp = dict(old) if isinstance(old, dict) else {}
        for key in draw(st.lists(st.sampled_from(sorted(SAMPLING)), min_size=1, max_size=2)):
            sp[key] = draw(SAMPLING[key])
        body["sampling_params"] = sp
    if route == "/v1/chat/completions" and draw(st.integers(0, 3)) == 0:
        body["messages"] = [{"role": "user", "content": draw(st.one_of(texts, values))}]
    return json.dumps(body).encode()  # NaN and Infinity as JavaScript writes them


@pytest.fixture(scope="module")
def pearld(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pearld, str]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "key").write_text(KEY)
    port = free_port()
    d = Pearld(
        tmp,
        [
            "cluster.preemptible_gpus=",
            "daemon.borrow=never",
            "rl.env=",
            f"workload.max_trajectory_tokens={CONTEXT}",
            f"gateway.listen=127.0.0.1:{port}",
            f"gateway.api_key_file={tmp / 'key'}",
            f"gateway.model={MODEL}",
        ],
        config=ROOT / "configs" / "local-cpu.toml",
    )
    try:
        d.start(120)
        wait_until(
            lambda: any(
                w["activity"] == "active" and w["role"] != "training" for w in d.status()["workers"]
            ),
            120,
            "a rollout worker serving",
            every=0.2,
        )
        yield d, f"http://127.0.0.1:{port}"
    finally:
        d.cleanup()


def server_errors(r: httpx.Response) -> list[str]:
    """The 5xx of a response: its status, or a server error among a stream's events."""
    if r.status_code >= 500:
        return [f"{r.status_code}: {r.text[:300]}"]
    if not r.headers.get("content-type", "").startswith("text/event-stream"):
        return []
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: {") and '"error"' in line:
            err = json.loads(line[6:]).get("error", {})
            if err.get("type") == "server_error" or int(err.get("code") or 0) >= 500:
                out.append(f"stream error: {line[:300]}")
    return out


def check_alive(d: Pearld, hosts: set[int]) -> None:
    assert d.running(), d.tail(40)
    stats = d.log_stats()
    assert not stats["restarts"] and not stats["failures"] and not stats["gave_up"], stats
    assert not stats["down"], stats["down"]
    assert {h.pid for h in d.hosts()} == hosts, "a worker host was restarted"


@pytest.mark.parametrize("route", ROUTES)
def test_no_generation_request_makes_a_5xx_or_restarts_anything(
    pearld: tuple[Pearld, str], route: str
) -> None:
    d, url = pearld
    hosts = {h.pid for h in d.hosts()}
    seen: list[str] = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:

        @FUZZ
        @given(body=bodies(route))
        def fuzz(body: bytes) -> None:
            r = http.post(route, content=body, headers={"Content-Type": "application/json"})
            bad = server_errors(r)
            assert not bad, (body[:400], bad)
            seen.append(str(r.status_code))

        fuzz()
        ok = http.post(route, json=base(route))
        assert ok.status_code == 200, ok.text  # neighbours after the fuzz are served
    assert "200" in seen and "400" in seen, sorted(set(seen))
    check_alive(d, hosts)


def test_no_read_or_control_request_makes_a_5xx(pearld: tuple[Pearld, str]) -> None:
    """GET routes with odd paths, and control events with odd bodies (refused ones only: the
    bodies are drawn so that no event can take the rollout worker away)."""
    d, url = pearld
    hosts = {h.pid for h in d.hosts()}
    kinds = ("gpus-added", "gpus-reclaimed", "preemption-notice", "training-begin",
             "training-finished", "no-such-kind")  # fmt: skip
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:

        @FUZZ
        @given(
            path=st.one_of(
                st.sampled_from(("/v1/models", "/pearl/v1/status", f"/v1/models/{MODEL}")),
                texts.map(lambda t: "/v1/models/" + quote(t, safe="/", errors="replace")),
            ),
            kind=st.sampled_from(kinds),
            body=st.one_of(st.binary(max_size=40), values.map(lambda v: json.dumps(v).encode())),
        )
        def fuzz(path: str, kind: str, body: bytes) -> None:
            r = http.get(path)
            assert r.status_code < 500, (path, r.status_code, r.text[:300])
            if _could_move_the_pool(body):
                return
            r = http.post(
                f"/pearl/v1/events/{kind}",
                content=body,
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code < 500, (kind, body[:300], r.status_code, r.text[:300])

        fuzz()
        assert http.get("/pearl/v1/status").status_code == 200
    check_alive(d, hosts)


def _could_move_the_pool(body: bytes) -> bool:
    """A body naming GPU 2 (the one rollout worker's) could legitimately take the pool away;
    the fuzz is about malformed input, so such bodies are skipped."""
    try:
        v = json.loads(body)
    except ValueError:
        return False
    gpus = v.get("gpus") if isinstance(v, dict) else None
    return isinstance(gpus, list | str) and any(str(g).strip() in ("2", "2.0") for g in gpus)
