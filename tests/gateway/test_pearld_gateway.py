"""pearld's gateway end to end: an embedded Runtime with ``gateway.listen`` serves the OpenAI API
over the pool, with its API key, and stops it with the daemon.

It needs the HTTP app (``pearl.gateway.app``); it is skipped where that module is absent."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import pearl
from pearl.testing.wait import wait_until

pytest.importorskip("pearl.gateway.app")
openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_an_embedded_runtime_serves_chat_completions_over_the_pool(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-test\n")
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / "local-cpu.toml",
        state_dir=tmp_path / "state",
        overrides=(
            "engine.kind=sim",
            "engine.sim.time_scale=0.05",
            "engine.sim.start_s=1",
            "rl.env=",
            "daemon.borrow=never",
            "daemon.tick_s=0.1",
            "gateway.listen=127.0.0.1:0",
            f"gateway.api_key_file={key}",
            "gateway.model=pearl-sim",
            "gateway.max_connections=64",
            "gateway.header_timeout_s=5",
            "gateway.allowed_origins=http://localhost:3000",
        ),
    )
    rt.start()
    try:
        url = rt.gateway_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        wait_until(
            lambda: any(
                w.activity == "active" and w.role != "training" for w in rt.status().workers
            ),
            60,
            "a worker serving",
            every=0.1,
        )
        assert httpx.get(f"{url}/models", timeout=10).status_code == 401  # no key
        assert rt.daemon.gateway.max_connections == 64  # the config's bounds reach the server
        auth = {"Authorization": "Bearer sk-test"}
        for origin, status in [("http://localhost:3000", 200), ("http://evil.example", 403)]:
            r = httpx.get(f"{url}/models", headers={**auth, "Origin": origin}, timeout=10)
            assert r.status_code == status
        client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0, timeout=30)
        assert [m.id for m in client.models.list().data] == ["pearl-sim"]
        out = client.chat.completions.create(
            model="pearl-sim",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=8,
            extra_headers={"X-Session-ID": "chat-1"},
        )
        assert out.choices[0].finish_reason in ("stop", "length")
        assert out.usage is not None and 0 < out.usage.completion_tokens <= 8
        turns = rt.daemon.gateway_backend.sessions.open["chat-1"].turns
        assert turns == 1
    finally:
        rt.stop()
    assert rt.daemon.gateway is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models", timeout=2)
