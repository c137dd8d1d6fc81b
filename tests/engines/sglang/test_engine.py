"""The sglang engine (one HTTP client) against the torch engine's SGLang facade: real compute."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
import torch

from pearl.core.state import Role
from pearl.engines.base import (
    EngineError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    KVTimeout,
    SamplingParams,
)
from pearl.engines.sglang import SGLangClient, SGLangEngine, generate_pd
from pearl.engines.sglang import protocol as P
from pearl.engines.sglang.client import HTTPError, request
from pearl.engines.torch import TorchEngine
from pearl.engines.torch import model as M
from pearl.testing.wait import wait_until

from ..helpers import prompt_of
from .conftest import NEW, OLD, Servers

LONG = 3000


def run(
    e: SGLangEngine, prompt: tuple[int, ...], rid: str = "r", n: int = 8, **kw: object
) -> GenerateResult:
    return e.generate(
        GenerateRequest(rid=rid, input_ids=prompt, sampling=SamplingParams(max_new_tokens=n), **kw)
    ).result(60)  # type: ignore[arg-type]


def reference(prompt: tuple[int, ...], n: int, weights: object = None) -> GenerateResult:
    """The same request on an in-process TorchEngine (tiny, seed 0)."""
    e = TorchEngine(preset="tiny")
    e.start()
    try:
        if weights is not None:
            e.load_weights(1, weights)
        return e.generate(
            GenerateRequest(rid="ref", input_ids=prompt, sampling=SamplingParams(max_new_tokens=n))
        ).result(60)
    finally:
        e.stop()


def pd(
    s: Servers,
    prefill: SGLangEngine,
    decode: SGLangEngine,
    prompt: tuple[int, ...],
    rid: str,
    n: int = 8,
) -> tuple[GenerateResult, GenerateResult]:
    sp = SamplingParams(max_new_tokens=n)
    peer = decode.kv_channel.address  # type: ignore[union-attr]
    fd = decode.generate(
        GenerateRequest(rid=rid, input_ids=prompt, sampling=sp, transfer_id=f"{rid}#0")
    )
    fp = prefill.generate(
        GenerateRequest(
            rid=rid, input_ids=prompt, sampling=sp, transfer_id=f"{rid}#0", kv_peer=peer
        )
    )
    return fp.result(60), fd.result(60)


def wait_tokens(c: SGLangClient, at_least: int, timeout: float = 30.0) -> None:
    start = c.metrics().get("sglang:generation_tokens_total", 0.0)
    wait_until(
        lambda: c.metrics().get("sglang:generation_tokens_total", 0.0) - start >= at_least,
        timeout,
        "the server to generate",
        every=0.02,
    )


def test_generation_is_the_torch_engines(servers: Servers) -> None:
    prompt = prompt_of(24)
    got = run(servers.coloc, prompt, n=10)
    want = reference(prompt, 10)
    assert got.output_ids == want.output_ids and got.finish_reason is FinishReason.LENGTH
    assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    assert got.prompt_tokens == 24 and got.weights_version == 0
    stop = want.output_ids[4]
    r = servers.coloc.generate(
        GenerateRequest(
            rid="s", input_ids=prompt, sampling=SamplingParams(max_new_tokens=10, stop_ids=(stop,))
        )
    ).result(60)
    assert r.finish_reason is FinishReason.STOP and r.output_ids[-1] == stop
    with pytest.raises(EngineError, match="empty"):
        servers.coloc.generate(GenerateRequest(rid="e", input_ids=()))


def test_pd_generation_with_bootstrap_rooms(servers: Servers) -> None:
    prompt = prompt_of(40, 3)
    want = run(servers.coloc, prompt, rid="c", n=12)
    rp, rd = pd(
        s=servers, prefill=servers.prefill, decode=servers.decode, prompt=prompt, rid="pd1", n=12
    )
    assert rp.finish_reason is FinishReason.PREFILLED and rp.output_ids == want.output_ids[:1]
    assert rd.output_ids == want.output_ids and rd.finish_reason is FinishReason.LENGTH
    # the same raw body to both servers, bootstrap fields added by the caller (SGLang's way)
    body = P.generate_body(
        GenerateRequest(rid="raw", input_ids=prompt, sampling=SamplingParams(max_new_tokens=12))
    )
    out = generate_pd(
        prefill=servers.prefill.client,
        decode=servers.decode.client,
        body=body,
        bootstrap_host="127.0.0.1",
        bootstrap_port=servers.prefill.spec.bootstrap_port,
    )
    assert out["output_ids"] == list(want.output_ids)
    recv = servers.decode.telemetry().transfers
    assert recv and recv[0].direction == "recv" and recv[0].bytes > 0


def test_decode_without_a_prefill_side_times_out_retryably(servers: Servers) -> None:
    e = servers.decode
    old = e.cfg
    e.cfg = dataclasses.replace(old, kv_timeout_s=0.3)
    try:
        with pytest.raises(KVTimeout, match="never got the request"):
            e.generate(
                GenerateRequest(rid="lost", input_ids=prompt_of(5), transfer_id="nobody")
            ).result(10)
    finally:
        e.cfg = old
    with pytest.raises(EngineError, match="kv_peer"):
        servers.prefill.generate(GenerateRequest(rid="p", input_ids=prompt_of(4), transfer_id="t"))


def test_abort_returns_the_prefix(servers: Servers) -> None:
    e = servers.coloc
    prompt = prompt_of(10, 2)
    fut = e.generate(
        GenerateRequest(rid="r1", input_ids=prompt, sampling=SamplingParams(max_new_tokens=LONG))
    )
    other = e.generate(
        GenerateRequest(rid="r10", input_ids=prompt, sampling=SamplingParams(max_new_tokens=LONG))
    )
    wait_tokens(e.client, 5)
    e.abort("r1")
    r = fut.result(30)
    assert r.finish_reason is FinishReason.ABORT and 0 < len(r.output_ids) < LONG
    assert len(r.logprobs) == len(r.output_ids)
    wait_tokens(e.client, 5)  # generation went on after the abort: r10 still runs
    assert not other.done() and "r10" in e.in_flight()  # SGLang aborts by prefix: not r10
    e.abort("r10")
    assert other.result(30).finish_reason is FinishReason.ABORT
    assert run(e, prompt, rid="ref", n=len(r.output_ids)).output_ids == r.output_ids
    assert e.in_flight() == []


def test_release_and_resume(servers: Servers) -> None:
    e = servers.coloc
    before = run(e, prompt_of(16), n=6)
    busy = e.generate(
        GenerateRequest(
            rid="busy", input_ids=prompt_of(8), sampling=SamplingParams(max_new_tokens=LONG)
        )
    )
    wait_tokens(e.client, 3)
    e.release_memory()  # aborts the running request first: SGLang releases only when idle
    r = busy.result(10)
    assert r.finish_reason is FinishReason.ABORT and 0 < len(r.output_ids) < LONG
    with pytest.raises(EngineError, match="resume_memory"):
        run(e, prompt_of(16))
    e.resume_memory()
    assert run(e, prompt_of(16), rid="after", n=6).output_ids == before.output_ids


def test_the_facade_refuses_to_release_a_busy_server(servers: Servers) -> None:
    c = servers.coloc.client
    body = P.generate_body(
        GenerateRequest(
            rid="raw-busy", input_ids=prompt_of(6), sampling=SamplingParams(max_new_tokens=LONG)
        )
    )
    t = threading.Thread(target=c.generate, args=(body,), daemon=True)
    t.start()
    wait_tokens(c, 2)
    with pytest.raises(HTTPError, match="idle"):
        c.release_memory()
    c.abort(body["rid"])
    t.join(20)


def test_endpoint_names_follow_the_server_version(servers: Servers) -> None:
    new, old = servers.coloc.client.detect(), servers.old.client.detect()
    assert (new.version, new.endpoints) == (NEW, P.Endpoints())
    assert (old.version, old.endpoints) == (OLD, P.Endpoints.legacy())
    assert servers.prefill.client.detect().role_switch and not old.role_switch
    assert request(servers.old.client.base + "/server_info")[0] == 404
    assert request(servers.coloc.client.base + "/get_server_info")[0] == 404
    assert request(servers.old.client.base + "/pd_role_switch", "POST", {})[0] == 404
    assert servers.old.client.model_info()["is_generation"] is True
    assert servers.coloc.client.model_info()["weight_version"] == "0"


def test_telemetry_comes_from_metrics(servers: Servers) -> None:
    e = servers.coloc
    e.telemetry()
    run(e, prompt_of(30), rid="t", n=12)
    its = e.telemetry().iterations
    decode = [i for i in its if i.decode_batch]
    prefill = [i for i in its if i.prefill_tokens]
    assert decode and decode[0].duration_s > 0
    assert prefill and prefill[0].prefill_tokens == 30


def test_weight_updates_by_version_survive_a_restart(servers: Servers, tmp_path: Path) -> None:
    """The old-style server: weights from disk with a version, then a restart-based role change
    (0.4.10 has no /pd_role_switch) comes back at the same version."""
    from safetensors.torch import save_file

    e = servers.old
    cfg = M.preset_config("tiny")
    state = M.build(
        config=cfg,
        source=M.WeightSource("seed", 1),
        device=torch.device("cpu"),
        dtype=torch.float32,
    ).state_dict()
    path = tmp_path / "v00000001.safetensors"
    save_file({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}, str(path))
    prompt = prompt_of(20, 5)
    old = run(e, prompt, n=10)
    e.load_weights(1, str(path))
    new = run(e, prompt, rid="new", n=10)
    assert new.weights_version == 1 and new.output_ids != old.output_ids
    assert new.output_ids == reference(prompt, 10, str(path)).output_ids
    assert e.client.model_info()["weight_version"] == "1"
    with pytest.raises(EngineError, match="older"):
        e.load_weights(0, str(path))
    pid = e.server.pid  # type: ignore[union-attr]
    e.set_role(Role.PREFILL)
    assert e.server.pid != pid and e.client.detect().mode == "prefill"  # type: ignore[union-attr]
    e.set_role(Role.COLOCATED)
    again = run(e, prompt, rid="again", n=10)
    assert again.output_ids == new.output_ids and again.weights_version == 1


def test_role_switch_in_place(servers: Servers) -> None:
    p, d = servers.prefill, servers.decode
    pids = (p.server.pid, d.server.pid)  # type: ignore[union-attr]
    busy = d.generate(GenerateRequest(rid="wait", input_ids=prompt_of(4), transfer_id="never"))
    with pytest.raises(EngineError, match="drain"):
        d.set_role(Role.PREFILL)
    d.abort("wait")
    assert busy.result(10).finish_reason is FinishReason.ABORT
    p.set_role(Role.DECODE)
    d.set_role(Role.PREFILL)
    assert (p.server.pid, d.server.pid) == pids  # type: ignore[union-attr]
    assert d.client.detect().mode == "prefill" and p.client.detect().mode == "decode"
    prompt = prompt_of(25, 7)
    _, rd = pd(s=servers, prefill=d, decode=p, prompt=prompt, rid="swapped", n=8)
    assert rd.output_ids == run(servers.coloc, prompt, rid="c2", n=8).output_ids
    p.set_role(Role.PREFILL)
    d.set_role(Role.DECODE)
    with pytest.raises(EngineError, match="serves as one of"):
        p.set_role(Role.TRAINING)


def test_weights_by_broadcast(servers: Servers) -> None:
    """The NCCL-broadcast path (the facade joins with gloo): the test is the trainer, rank 0.
    The old server gets the seed-0 weights back as version 2 (the other tests' reference)."""
    import torch.distributed as dist

    from pearl.engines.sglang import DistributedWeights

    from .conftest import free_base

    e = servers.old
    prompt = prompt_of(20, 5)
    before = run(e, prompt, rid="b", n=10)
    port = free_base(1)
    joined = threading.Thread(
        target=dist.init_process_group,
        args=("gloo",),
        kwargs=dict(init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=0),
    )
    joined.start()
    e.client.init_weights_update_group(
        master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=2, backend="gloo"
    )
    joined.join(30)
    try:
        state = M.build(
            config=M.preset_config("tiny"),
            source=M.WeightSource("seed", 0),
            device=torch.device("cpu"),
            dtype=torch.float32,
        ).state_dict()
        names = sorted(state)
        update = DistributedWeights(
            tuple(names), ("float32",) * len(names), tuple(tuple(state[n].shape) for n in names)
        )
        loader = threading.Thread(target=e.load_weights, args=(2, update))
        loader.start()
        for n in names:
            dist.broadcast(state[n].contiguous(), src=0)
        loader.join(60)
    finally:
        e.client.destroy_weights_update_group()
        dist.destroy_process_group()
    after = run(e, prompt, rid="a", n=10)
    assert after.weights_version == 2 and after.output_ids != before.output_ids
    assert after.output_ids == run(servers.coloc, prompt, rid="c", n=10).output_ids


def test_a_crashed_server_is_relaunched(servers: Servers) -> None:
    import os
    import signal

    e = servers.coloc
    assert e.server is not None
    prompt = prompt_of(12, 9)
    before = run(e, prompt, rid="pre", n=6)
    pid = e.server.pid
    os.kill(pid, signal.SIGKILL)

    def relaunched() -> GenerateResult | None:
        try:
            out = run(e, prompt, rid="post", n=6)
        except EngineError:  # refused while it is relaunched: routed again
            return None
        # Sent to the dead server: no tokens, aborted, so that it resumes (not a failure).
        return None if out.finish_reason is FinishReason.ABORT and not out.output_ids else out

    after = wait_until(relaunched, 60, "the server to be relaunched", every=0.5)
    assert e.server.pid != pid and after.output_ids == before.output_ids
