"""Poison requests against a real pool: a request that no worker could take is a 400 that touches
no worker, and one that fails in a worker fails alone.

- pearld (sim, with an API key): an id, a stop id or a seed of 2**64 cannot be encoded for a
  worker host; once, each restarted the host until its budget ran out and pearld exited.
- The torch engine (tiny model, vocabulary 512): a prompt id of 600 among 30 concurrent chats
  (once, 27 of the 30 failed with it), and the /generate example of docs/gateway.md.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from pearl import config as C
from pearl.gateway.pool import served_vocab
from pearl.testing.pearld import ROOT, Pearld, free_port
from pearl.testing.wait import wait_until
from tests.gateway.conftest import local_runtime

pytest.importorskip("pearl.gateway.app")

BIG = 2**64
DOCS = ROOT / "docs" / "gateway.md"
JSON = {"content-type": "application/json"}


def engine(
    kind: str = "torch",
    preset: str = "tiny",
    sim_vocab: int = 0,
    vllm_model_path: str = "",
    sglang_model_path: str = "",
) -> C.Config:
    """A Config whose engine is ``kind`` with these keys of its tables."""
    return C.Config(
        engine=C.EngineConfig(
            kind=kind,  # type: ignore[arg-type]
            torch=C.TorchConfig(preset=preset),
            sim=C.SimConfig(vocab=sim_vocab),
            vllm=C.VllmConfig(model_path=vllm_model_path),
            sglang=C.SGLangConfig(model_path=sglang_model_path),
        )
    )


def test_the_served_vocabulary_is_the_models(tmp_path: Path) -> None:
    tok = SimpleNamespace(vocab_size=259)
    assert served_vocab(engine(), tok) == 512  # the tiny preset's embedding
    assert served_vocab(engine(preset="qwen3-0.6b"), tok) == 151_936
    assert served_vocab(engine(kind="sim"), tok) == 151_936
    assert served_vocab(engine(kind="sim", sim_vocab=1000), tok) == 1000
    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "vocab_size": 4242}')
    assert served_vocab(engine(kind="vllm", vllm_model_path=str(tmp_path)), tok) == 4242
    assert served_vocab(engine(preset=str(tmp_path)), tok) == 4242
    (tmp_path / "config.json").write_text('{"text_config": {"vocab_size": 77}}')
    assert served_vocab(engine(kind="sglang", sglang_model_path=str(tmp_path)), tok) == 77
    assert served_vocab(engine(kind="vllm", vllm_model_path=str(tmp_path / "no")), tok) == 259
    assert served_vocab(engine(kind="vllm", preset="tiny32"), tok) == 512  # pearl demo writes it
    assert served_vocab(engine(kind="vllm", preset="other"), SimpleNamespace()) == 2**63


def workers_serving(status: dict[str, Any]) -> bool:
    return any(w["activity"] == "active" and w["role"] != "training" for w in status["workers"])


@pytest.mark.slow
def test_unencodable_ints_are_400s_and_pearld_and_its_hosts_live_on(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-test\n")
    port = free_port()
    d = Pearld(tmp_path, config=ROOT / "configs" / "local-cpu.toml", sets=[
        "engine.kind=sim", "engine.sim.time_scale=0.05", "engine.sim.start_s=1", "rl.env=",
        "daemon.borrow=never", "daemon.tick_s=0.1", f"gateway.listen=127.0.0.1:{port}",
        f"gateway.api_key_file={key}", "gateway.model=pearl-sim"])  # fmt: skip
    try:
        d.start()
        wait_until(lambda: workers_serving(d.status()), 60, "a worker serving", every=0.2)
        hosts = {h.pid for h in d.hosts()}
        url, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer sk-test"}
        chat = {"model": "pearl-sim", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4}  # fmt: skip
        poisons = [
            ("/v1/chat/completions", {**chat, "stop_token_ids": [BIG]}, "stop_token_ids"),
            ("/v1/chat/completions", {**chat, "seed": BIG}, "seed"),
            ("/v1/completions", {"model": "pearl-sim", "prompt": [5, BIG]}, "prompt"),
            ("/generate", {"input_ids": [BIG]}, "input_ids"),
            ("/generate", {"text": "hi", "sampling_params": {"seed": BIG}},
             "sampling_params.seed"),
            ("/v1/chat/completions", {**chat, "user": "\ud800"}, "user"),
        ]  # fmt: skip
        with httpx.Client(base_url=url, headers=auth, timeout=30) as c:
            for path, body, param in poisons:
                # json.dumps: ASCII, a lone surrogate as its \ud800 escape
                r = c.post(path, content=json.dumps(body), headers=JSON)
                assert r.status_code == 400, (path, r.text)
                assert r.json()["error"]["param"] == param
            r = c.post("/v1/chat/completions", json=chat)
            assert r.status_code == 200, r.text
        assert d.running()
        assert {h.pid for h in d.hosts()} == hosts  # no host was restarted
        stats = d.log_stats()
        assert (stats["down"], stats["restarts"], stats["gave_up"]) == ([], {}, [])
    finally:
        d.cleanup()


def docs_generate_example() -> dict[str, Any]:
    """The body of docs/gateway.md's /generate curl example."""
    m = re.search(r"curl [^\n]*http://127\.0\.0\.1:8000/generate .*?-d '(.*?)'",
                  DOCS.read_text(), re.S)  # fmt: skip
    assert m is not None, "docs/gateway.md has no /generate example"
    return dict(json.loads(m[1]))


@pytest.mark.slow
def test_a_poison_among_30_chats_on_the_torch_engine_fails_alone(tmp_path: Path) -> None:
    port = free_port()
    sets = ("rl.env=", "daemon.borrow=never", "daemon.tick_s=0.1",
            f"gateway.listen=127.0.0.1:{port}", "gateway.model=tiny")  # fmt: skip
    with local_runtime(tmp_path, sets) as rt:
        wait_until(
            lambda: any(w.activity == "active" and w.role != "training"
                        for w in rt.status().workers),
            120, "a torch worker serving", every=0.2,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=120) as c:
            r = c.post("/generate", json=docs_generate_example())
            assert r.status_code == 200, r.text
            assert r.json()["meta_info"]["completion_tokens"] > 0

            def chat(i: int) -> int:
                body = {"model": "tiny", "max_tokens": 8,
                        "messages": [{"role": "user", "content": f"question {i}"}]}  # fmt: skip
                return c.post("/v1/chat/completions", json=body).status_code

            poison = {"model": "tiny", "prompt": [600, 5], "max_tokens": 8}
            with cf.ThreadPoolExecutor(31) as pool:
                chats = [pool.submit(chat, i) for i in range(30)]
                bad = c.post("/v1/completions", json=poison)
                codes = [f.result() for f in chats]
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
        assert "token id 600" in bad.json()["error"]["message"]
        assert codes == [200] * 30
