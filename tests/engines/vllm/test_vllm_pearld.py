"""pearld with a vLLM worker, as a process: SIGKILLed and restarted, it adopts the running worker
host and its vLLM server (the same processes serve on); a vLLM server that dies is noticed by its
host and relaunched at the same port, and the worker stays in the table. The status equals the
replay of the log after each. The checkpoint is a Llama (with the conftest Qwen3's tokenizer):
any architecture vLLM serves, served as configured, its greedy tokens equal transformers'
forward (here rather than a server of its own in test_vllm_engine.py: a start is tens of
seconds)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from pearl.engines.vllm.client import VLLMClient
from pearl.engines.vllm.launch import SERVED_NAME, VLLM_MODULE
from pearl.engines.web import call

from ...daemon.conftest import Pearld, wait_until
from .conftest import free_port, vllm_python

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
PROMPT = [5, 17, 42, 99, 3, 250, 7, 64]


class VLLMPearld(Pearld):
    def command(self, endpoint: str) -> list[str]:
        sets = [x for s in self.sets for x in ("--set", s)]
        return [sys.executable, "-m", "pearl.daemon", "--config",
                str(ROOT / "configs" / "local-vllm.toml"), "--state-dir", str(self.state),
                "--endpoint", endpoint, *sets]  # fmt: skip


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def server_pid(host: int) -> int | None:
    """The vLLM API server under a worker host (the leader of its process group), if any."""
    for pid in descendants(host):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if VLLM_MODULE.encode() in argv and os.getpgid(pid) == pid:
            return pid
    return None


def greedy(url: str) -> list[int]:
    body = {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    return list(
        call(url + "/v1/completions", "POST", body, timeout_s=120)["choices"][0]["token_ids"]
    )


def serving(d: Pearld) -> dict[int, Any]:
    s = d.status()
    ok = not s["transitions"] and s["plan"] is None and not s["failed"]
    return {
        w["gpus"][0]: w
        for w in s["workers"]
        if ok and w["activity"] == "active" and w["role"] != "training"
    }


def status_is_replay(d: Pearld) -> None:
    def same() -> bool:
        s = d.status()
        t = d.replayed().to_json()
        return all(s[k] == t[k] for k in ("seq", "workers", "mode", "N_C"))

    wait_until(same, 30, "the status to equal the replay of the log")


def transformers_greedy(model_dir: Path, n: int = 8) -> list[int]:
    """``n`` greedy tokens after PROMPT from transformers' forward of the checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False,
                             min_new_tokens=n)[0]  # fmt: skip
    return list(out[len(PROMPT) :].tolist())


@pytest.fixture
def daemon(tiny_llama: Path, tmp_path: Path) -> Any:
    port = free_port()
    sets = [
        "rl.env=",
        "cluster.training_gpus=0",
        "cluster.reserved_gpus=1",
        "cluster.preemptible_gpus=",
        "daemon.borrow=never",
        f"engine.vllm.model_path={tiny_llama}",
        f"engine.vllm.python={vllm_python()}",
        f"engine.vllm.port={port - 1}",  # GPU 1's server on the free port
        "engine.vllm.max_model_len=512",
        "engine.vllm.kv_cache_mb=64",
    ]
    d = VLLMPearld(tmp_path, sets)
    try:
        d.start(60)
        yield d, f"http://127.0.0.1:{port}"
    finally:
        hosts = list(d.host_pids().values())
        d.cleanup()
        for host in hosts:  # a host killed first leaves its server's group behind
            for pid in descendants(host):
                if pid == os.getpgid(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)


def test_pearld_killed_adopts_the_running_vllm_host_and_a_dead_server_is_relaunched(
    daemon: Any, tiny_llama: Path
) -> None:
    d, url = daemon
    wait_until(lambda: 1 in serving(d), 600, "the vLLM worker to serve")
    before = greedy(url)
    assert before == transformers_greedy(tiny_llama)  # a Llama, served as transformers runs it
    ((name, host),) = d.host_pids().items()
    server = server_pid(host)
    assert server is not None

    d.kill9()
    d.start(60)
    wait_until(lambda: 1 in serving(d), 120, "the adopted worker in the table")
    assert d.host_pids() == {name: host}  # adopted, not relaunched
    assert server_pid(host) == server and greedy(url) == before
    status_is_replay(d)
    incarnation = serving(d)[1]["incarnation"]

    os.kill(server, signal.SIGKILL)  # the vLLM server dies under its host
    wait_until(lambda: server_pid(host) not in (None, server), 120, "a new server")
    wait_until(VLLMClient(url).healthy, 600, "the new server to answer")
    assert greedy(url) == before  # the same weights
    assert d.host_pids() == {name: host} and serving(d)[1]["incarnation"] == incarnation
    status_is_replay(d)
