"""vLLM under PEARL: a Runtime whose worker hosts each run a real vLLM server (the tiny Qwen3
written by the conftest), with requests routed by PEARL's Router and elastic events from the
test. Greedy output through PEARL equals a direct request to a server; a worker that joins
serves the published weights from its first request; its reclaim moves the turns in flight with
their prefixes and each ends equal to its unmigrated run; a borrow cycle pauses and resumes a
lent server. After each, the table pearld reports equals the replay of its log. Through the
OpenAI gateway: ``n`` seeded samples equal single requests with the seeds the docs name, and a
``response_format`` JSON schema parses. TRL's GRPOTrainer takes a step on the servers.

The tests share one runtime (a vLLM server takes tens of seconds to start) and run in order; the
only preemptible worker is the joiner, so that the reclaim needs no server start of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pykka
import pytest

import pearl
from actors import base, names
from pearl.core import events as ev
from pearl.core.status import status_plain
from pearl.engines.base import GenerateRequest, SamplingParams
from pearl.engines.vllm.client import VLLMClient
from pearl.engines.vllm.engine import body
from pearl.engines.vllm.launch import SERVED_NAME
from pearl.engines.web import call
from pearl.log import FileLog

from ...daemon.conftest import wait_until
from ..trainer import Trainer
from .conftest import free_port, vllm_python

pytestmark = [pytest.mark.slow, pytest.mark.shared_actors, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "local-vllm.toml"
PROMPTS = {f"q{i}": tuple((7 * i + 13 * k) % 250 + 1 for k in range(6 + i)) for i in range(6)}


def free_base(n: int) -> int:
    """A port with the ``n`` after it free too (one server per GPU id)."""
    import socket

    for _ in range(50):
        port = free_port()
        with contextlib.ExitStack() as stack:
            try:
                for k in range(n):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port + k))
            except OSError:
                continue
            return port
    raise AssertionError("no run of free ports")


def host_pids(state: Path) -> set[int]:
    out = set()
    for f in (state / "workers").glob("worker-*.pid"):
        with contextlib.suppress(ValueError, OSError):
            out.add(int(f.read_text()))
    return out


class Cluster:
    """The runtime, its Router's client (a Trainer actor), the servers' base port and the
    gateway's URL."""

    def __init__(self, rt: Any, trainer: Any, base_port: int, state: Path, gateway: str) -> None:
        self.rt, self.trainer, self.base, self.state = rt, trainer, base_port, state
        self.gateway = gateway

    def url(self, gpu: int) -> str:
        return f"http://127.0.0.1:{self.base + gpu}"

    def serving(self) -> dict[int, dict[str, Any]]:
        """GPU id -> worker, for the active rollout workers."""
        return {
            w["gpus"][0]: w
            for w in status_plain(self.rt.status())["workers"]
            if w["activity"] == "active" and w["role"] != "training"
        }

    def settled(self, gpus: set[int], timeout: float = 600) -> None:
        def ok() -> bool:
            s = status_plain(self.rt.status())
            return set(self.serving()) == gpus and not s["transitions"] and s["plan"] is None

        wait_until(ok, timeout, f"workers serving on GPUs {sorted(gpus)}")

    def direct(self, gpu: int, prompt: tuple[int, ...], n: int) -> list[int]:
        body = {
            "model": SERVED_NAME,
            "prompt": list(prompt),
            "max_tokens": n,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        out = call(self.url(gpu) + "/v1/completions", "POST", body, timeout_s=300)
        return list(out["choices"][0]["token_ids"])

    def submit(self, rid: str, prompt: tuple[int, ...], n: int) -> None:
        self.trainer.submit(rid, prompt, n).get()

    def answers(self, rids: set[str], timeout: float = 200) -> dict[str, Any]:
        """The Trainer's status once every one of ``rids`` finished, cut to them."""

        def done() -> dict[str, Any] | None:
            s = dict(self.trainer.status().get())
            if not rids <= set(s["finished"]):
                return None
            return {k: {r: v for r, v in s[k].items() if r in rids} if isinstance(s[k], dict)
                    else s[k] for k in s}  # fmt: skip

        try:
            return wait_until(done, timeout, "answers")  # type: ignore[no-any-return]
        except AssertionError:  # say what is missing and where the Router holds it
            s = dict(self.trainer.status().get())
            router = self.rt.daemon.directory.get(names.ROUTER).ref.proxy()
            pending = {r: p.workers for r, p in router.pending.get().items()}
            missing = sorted(rids - set(s["finished"]))
            raise AssertionError(
                f"no answer to {missing}; router pending {pending}, stats "
                f"{router.stats().get()}, client errors {s['errors']}, sends {s['sends']}, "
                f"status {status_plain(self.rt.status())['workers']}"
            ) from None

    def status_is_replay(self) -> None:
        def same() -> bool:
            status = status_plain(self.rt.status())
            with FileLog(self.state / "log", readonly=True) as log:
                table = log.load().state.to_json()
            keys = ("seq", "workers", "mode", "N_P", "N_D", "N_C")
            return all(status[k] == table[k] for k in keys)

        wait_until(same, 30, "the status to equal the replay of the log")


@pytest.fixture(scope="module")
def cluster(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state = tmp_path_factory.mktemp("vllm-pearl") / "state"
    port, gateway = free_base(4), free_port()
    overrides = (
        "rl.env=",  # no rollout pipeline: the test's Trainer routes the requests
        "cluster.training_gpus=0",
        "cluster.reserved_gpus=1",
        "cluster.preemptible_gpus=2-3",
        "cluster.initial_preemptible=",  # none: the preemptible worker is the joiner (GPU 3)
        "daemon.borrow=always",
        f"engine.vllm.model_path={tiny_model}",
        f"engine.vllm.python={vllm_python()}",
        f"engine.vllm.port={port}",
        "engine.vllm.max_model_len=512",
        "engine.vllm.kv_cache_mb=64",
        f"gateway.listen=127.0.0.1:{gateway}",  # the OpenAI gateway, the model dir's tokenizer
    )
    rt = pearl.Runtime.from_config(CONFIG, state_dir=state, overrides=overrides)
    seen: set[int] = set()
    try:
        rt.start()
        d: base.Directory = rt.daemon.directory
        trainer = base.start(d, Trainer, d)
        c = Cluster(rt=rt, trainer=trainer.ref.proxy(), base_port=port, state=state,
                    gateway=f"http://127.0.0.1:{gateway}")  # fmt: skip
        c.settled({0, 1})
        yield c
    finally:
        seen |= host_pids(state)
        with contextlib.suppress(Exception):
            rt.stop()
        pykka.ActorRegistry.stop_all(timeout=10)  # the Trainer
        for pid in seen | host_pids(state):  # whatever a failure left behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def test_greedy_through_pearl_equals_a_direct_request(cluster: Cluster) -> None:
    c = cluster
    want = {rid: c.direct(1, p, 24) for rid, p in PROMPTS.items()}
    for rid, p in PROMPTS.items():
        c.submit(rid, p, 24)
    got = c.answers(set(PROMPTS))
    assert got["finished"] == want and not got["errors"] and got["aborts"] == 0
    c.status_is_replay()


def test_a_worker_that_joins_serves_the_published_weights_from_the_start(
    cluster: Cluster, tiny_model: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    c = cluster
    model = Qwen3ForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)
    torch.manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    c.rt.publish_weights(state, 1)
    wait_until(lambda: status_plain(c.rt.status())["weights_version"] == 1, 60, "weights version 1")
    c.rt.event(ev.GpusAdded(gpus=(3,)))
    first = wait_until(lambda: 3 in c.serving(), 600, "the joiner to serve")
    # The moment the table routes to it, its server already holds version 1.
    assert call(c.url(3) + "/weight_info")["weight_version"] == "1", first
    prompt = PROMPTS["q3"]
    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)[0]
    assert c.direct(3, prompt, 12) == ref[len(prompt) :].tolist()
    for rid, p in PROMPTS.items():
        c.submit(f"w{rid}", p, 12)
    got = c.answers({f"w{rid}" for rid in PROMPTS})
    assert all(v == [1] for k, v in got["versions"].items() if k.startswith("w"))
    c.settled({0, 1, 3})
    c.status_is_replay()


def test_a_reclaim_moves_turns_with_their_prefix_and_they_end_as_unmigrated(
    cluster: Cluster,
) -> None:
    c, n = cluster, 160
    want = {f"m{rid}": c.direct(1, p, n) for rid, p in PROMPTS.items()}
    router = c.rt.daemon.directory.get(names.ROUTER).ref.proxy()
    on_3 = next(w["id"] for g, w in c.serving().items() if g == 3)  # the joiner
    for rid, p in PROMPTS.items():
        c.submit(f"m{rid}", p, n)

    def streaming_on_3() -> list[str]:
        pending = router.pending.get()
        got = c.trainer.status().get()["got"]
        return [rid for rid, p in pending.items() if on_3 in p.workers and not got[rid]]

    wait_until(streaming_on_3, 120, "turns in flight on the preemptible worker")
    # Freeze them there (vLLM keeps paused requests queued), so the reclaim lands while they
    # still run however fast this machine decodes.
    call(c.url(3) + "/pause?mode=keep", "POST", {})
    moving = streaming_on_3()
    assert moving, "every turn on the preemptible worker ended before its server paused"
    c.rt.event(ev.GpusReclaimed(gpus=(3,)))
    got = c.answers(set(want), timeout=240)
    assert got["finished"] == want  # every turn equals its unmigrated greedy run
    assert not got["errors"], got["errors"]  # no request failed
    migrated = [rid for rid in moving if got["sends"][rid] > 1]
    assert migrated, (moving, got["sends"])  # the reclaimed worker's turns moved
    c.settled({0, 1})
    c.status_is_replay()


def test_a_borrow_cycle_pauses_the_lent_server_and_resumes_it(cluster: Cluster) -> None:
    c = cluster
    assert call(c.url(0) + "/is_paused")["is_paused"] is False  # lent: serving
    with c.rt.training(step=1):
        assert 0 not in c.serving()
        assert call(c.url(0) + "/is_paused")["is_paused"] is True  # back: paused, not stopped
        for rid, p in PROMPTS.items():
            c.submit(f"b{rid}", p, 8)
        c.answers({f"b{rid}" for rid in PROMPTS})
    c.settled({0, 1})
    assert call(c.url(0) + "/is_paused")["is_paused"] is False
    borrow = status_plain(c.rt.status())["borrow"]
    assert (borrow["current"] or borrow["last"] or {}).get("step") == 1, borrow
    c.status_is_replay()


def test_seeded_sampling_reproduces_itself_and_kills_no_engine(cluster: Cluster) -> None:
    """vLLM's CPU build kills its engine when it chunks the prefill of a seeded request; the
    launch turns chunked prefill off. Many seeded requests at once, each twice: equal pairs."""
    c = cluster
    client = VLLMClient(c.url(1))
    prompts = [tuple((i + 3 * k) % 250 + 1 for k in range(240)) for i in range(24)]

    def run(i: int) -> tuple[int, ...]:
        sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=i // 2)
        req = GenerateRequest(rid=f"s{i}", input_ids=prompts[i // 2], sampling=sampling)
        return tuple(client.completion(body(req), 120).run().token_ids)

    with ThreadPoolExecutor(48) as pool:
        outs = list(pool.map(run, range(48)))
    assert all(outs[2 * k] == outs[2 * k + 1] and len(outs[2 * k]) == 8 for k in range(24))
    assert client.healthy()


def test_n_seeded_samples_through_the_gateway_equal_single_requests(cluster: Cluster) -> None:
    """docs/gateway.md: with ``seed`` s, sample i uses seed s + i."""
    c = cluster
    model = call(c.gateway + "/v1/models")["data"][0]["id"]
    ask = {"model": model, "prompt": "what is 12 + 30?", "max_tokens": 12, "temperature": 1.0,
           "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    url = c.gateway + "/v1/completions"
    many = call(url, "POST", {**ask, "n": 3, "seed": 40}, timeout_s=300)["choices"]
    assert [ch["index"] for ch in many] == [0, 1, 2]
    singles = [call(url, "POST", {**ask, "seed": 40 + i}, timeout_s=300)["choices"][0]
               for i in range(3)]  # fmt: skip
    assert [ch["token_ids"] for ch in many] == [ch["token_ids"] for ch in singles]
    assert [ch["text"] for ch in many] == [ch["text"] for ch in singles]
    assert all(len(ch["token_ids"]) == 12 for ch in many)
    assert len({tuple(ch["token_ids"]) for ch in many}) > 1  # the samples differ


def test_a_json_schema_chat_request_through_the_gateway_parses(cluster: Cluster) -> None:
    import json

    import jsonschema

    c = cluster
    model = call(c.gateway + "/v1/models")["data"][0]["id"]
    schema = {"type": "object", "properties": {"answer": {"enum": [41, 42, 43]},
              "sure": {"type": "boolean"}}, "required": ["answer", "sure"],
              "additionalProperties": False}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    for seed in range(3):
        messages = [{"role": "user", "content": "what is 12 + 30?"}]
        ask = {"model": model, "messages": messages, "max_tokens": 64, "temperature": 1.0,
               "seed": seed, "response_format": fmt}  # fmt: skip
        out = call(c.gateway + "/v1/chat/completions", "POST", ask, timeout_s=300)
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_trls_grpo_trainer_trains_through_the_vllm_workers(
    cluster: Cluster, tiny_model: Path, tmp_path: Path
) -> None:
    """TRL's GRPOTrainer, unmodified (pearl.integrations.trl), on vLLM workers: one step whose
    rollouts the cluster's servers generate, its weights published to them. Here rather than in
    tests/integrations/test_trl.py, which has no vLLM server of its own: a server start is tens
    of seconds, and this module's are up."""
    pytest.importorskip("trl", reason="the trl extra: pip install -e '.[trl]'")
    from tests.integrations.test_trl import check_trained, trl_run

    c = cluster
    serving = c.serving()
    assert set(serving) == {0, 1}, serving
    for gpu in serving:  # every rollout worker is one of the cluster's vLLM servers
        assert call(c.url(gpu) + "/v1/models")["data"][0]["id"] == SERVED_NAME
    run = trl_run(
        c.rt, tiny_model, tiny_model, tmp_path / "trl", steps=1, batch=4, generations=2,
        max_len=512, tokenizer=str(tiny_model),
    )  # fmt: skip
    check_trained(run, c.state, steps=1, batch=4)
    version = str(run.rollout.base + 1)  # TRL's step, served by the vLLM servers
    for gpu in serving:
        wait_until(lambda g=gpu: call(c.url(g) + "/weight_info")["weight_version"] == version,
                   60, f"the server on GPU {gpu} at TRL's weights", 0.2)  # fmt: skip
    c.settled({0, 1})
    c.status_is_replay()
