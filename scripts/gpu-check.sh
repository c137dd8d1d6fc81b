#!/usr/bin/env bash
# PEARL against real SGLang servers on a GPU machine: prints PASS/FAIL per step with timings.
#
#   pip install -e '.[sglang]'          # sglang and sglang-router, on a machine with a GPU
#   bash scripts/gpu-check.sh           # exit status 0 only when every step passed
#
# It writes a tiny random-weight Qwen3 model (no download: the machine may be offline), launches
# two SGLang servers on it through PEARL's sglang engine (both on GPU 0 unless GPUS="0 1"), and
# runs: colocated generation -> switch to disaggregated (prefill + decode, KV over the transfer
# backend) -> prefill<->decode role switch in place (SGLang 0.5.21+, else by restart) -> back to
# colocated -> a borrow/return cycle (release/resume memory, GPU memory measured) -> a weight
# update by version from disk. Then the same through the real sglang-router.
#
# Knobs (environment): PY (python), GPUS ("0" or "0 1"), TRANSFER (mooncake | nixl), PORT (base),
# MEM (--mem-fraction-static per server), MODULE (sglang.launch_server; pearl.engines.torch.http
# runs the whole script on CPU against the torch facade, which is how it was checked without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
export GPUS=${GPUS:-0} TRANSFER=${TRANSFER:-mooncake} PORT=${PORT:-31000} MEM=${MEM:-0.3}
export MODULE=${MODULE:-sglang.launch_server}
exec "$PY" - <<'EOF'
import os, sys, tempfile, threading, time
from pathlib import Path

from pearl.core.state import Role
from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams
from pearl.engines.sglang import SGLangEngine, SGLangEngineConfig, ServerSpec
from pearl.engines.sglang.router import SGLangRouterLink, launch_routers
from transports.bulk import ZmqKVChannel

GPUS, PORT, MODULE = os.environ["GPUS"].split(), int(os.environ["PORT"]), os.environ["MODULE"]
FACADE = MODULE != "sglang.launch_server"
results: list[tuple[str, bool, float, str]] = []


def step(name):
    def wrap(fn):
        t0 = time.monotonic()
        try:
            note = fn() or ""
            ok = True
        except Exception as e:  # report and go on: every step is printed
            ok, note = False, f"{type(e).__name__}: {e}"
        results.append((name, ok, time.monotonic() - t0, note))
        print(f"{'PASS' if ok else 'FAIL'}  {name:<44} {time.monotonic() - t0:7.2f}s  {note}",
              flush=True)
        return fn
    return wrap


def tiny_model(seed: int) -> Path:
    """A 2-layer Qwen3 with head_dim 128 (what GPU attention kernels expect), random weights."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(tempfile.mkdtemp(prefix="pearl-gpu-check-"))
    cfg = Qwen3Config(vocab_size=4096, hidden_size=512, intermediate_size=1024,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    return out


model = tiny_model(0)
new_weights = tiny_model(1)
extra = ("--pretend-version", os.environ.get("PRETEND", "0.5.21")) if FACADE else (
    "--skip-tokenizer-init", "--mem-fraction-static", os.environ["MEM"], "--cuda-graph-max-bs", "8")
chans = [ZmqKVChannel(), ZmqKVChannel()]


def engine(i: int) -> SGLangEngine:
    spec = ServerSpec(model_path=str(model), port=PORT + i, bootstrap_port=PORT + 100 + i,
                      transfer_backend=os.environ["TRANSFER"], role_switch=True, module=MODULE,
                      extra_args=extra)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=GPUS[i % len(GPUS)])
    return SGLangEngine(SGLangEngineConfig(spec, startup_timeout_s=900, env=env,
                                           log_path=f"/tmp/pearl-gpu-check-{i}.log"),
                        role=Role.COLOCATED, kv_channel=chans[i])


A, B = engine(0), engine(1)
PROMPTS = [tuple((17 * i + 7 * j) % 4000 + 3 for j in range(40 + 13 * i)) for i in range(8)]
SP = SamplingParams(max_new_tokens=32)
want: dict[int, tuple[int, ...]] = {}


def coloc(e: SGLangEngine, tag: str) -> list:
    futs = [e.generate(GenerateRequest(f"{tag}{i}", p, SP)) for i, p in enumerate(PROMPTS)]
    return [f.result(300) for f in futs]


def pd(prefill: SGLangEngine, decode: SGLangEngine, tag: str) -> list:
    """PEARL's PD hand-off: the decode engine waits for the room the prefill engine draws."""
    peer = decode.kv_channel.address
    fd = [decode.generate(GenerateRequest(f"{tag}{i}", p, SP, transfer_id=f"{tag}{i}#0"))
          for i, p in enumerate(PROMPTS)]
    for i, p in enumerate(PROMPTS):
        prefill.generate(GenerateRequest(f"{tag}{i}", p, SP, transfer_id=f"{tag}{i}#0",
                                         kv_peer=peer))
    return [f.result(300) for f in fd]


def check(results_: list, what: str) -> str:
    assert all(len(r.output_ids) == SP.max_new_tokens for r in results_), f"{what}: short outputs"
    same = sum(r.output_ids == want[i] for i, r in enumerate(results_))
    return f"{same}/{len(results_)} identical to colocated"


@step("launch two servers (colocated)")
def _():
    ts = [threading.Thread(target=e.start) for e in (A, B)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return f"SGLang {A.version} at {A.spec.url}, {B.spec.url}"


@step("colocated generation on both")
def _():
    ra, rb = coloc(A, "ca"), coloc(B, "cb")
    want.update({i: r.output_ids for i, r in enumerate(ra)})
    same = sum(x.output_ids == y.output_ids for x, y in zip(ra, rb))
    assert same == len(ra), f"only {same}/{len(ra)} outputs agree between the servers"
    return f"{len(ra)} requests x 2 servers agree"


@step("switch colocated -> disaggregated (restart)")
def _():
    A.set_role(Role.PREFILL)
    B.set_role(Role.DECODE)
    return f"modes {A.client.detect().mode}/{B.client.detect().mode}"


@step("disaggregated generation (A prefill, B decode)")
def _():
    return check(pd(A, B, "pd"), "pd")


@step("role switch prefill <-> decode")
def _():
    pids = (A.server.pid, B.server.pid)
    how = "in place" if A.client.detect().role_switch else "by restart (no /pd_role_switch)"
    A.set_role(Role.DECODE)
    B.set_role(Role.PREFILL)
    kept = (A.server.pid, B.server.pid) == pids
    return f"{how}; processes kept: {kept}"


@step("disaggregated generation (B prefill, A decode)")
def _():
    return check(pd(B, A, "sw"), "swapped")


@step("switch disaggregated -> colocated (restart)")
def _():
    A.set_role(Role.COLOCATED)
    B.set_role(Role.COLOCATED)
    return check(coloc(A, "back"), "back")


def gpu_mem() -> int:
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                              "nounits"], capture_output=True, text=True, timeout=20).stdout
        return sum(int(x) for x in out.split())
    except (OSError, ValueError, subprocess.SubprocessError):
        return -1


@step("borrow: release B's memory, A keeps serving")
def _():
    before = gpu_mem()
    busy = B.generate(GenerateRequest("busy", PROMPTS[0], SamplingParams(max_new_tokens=2000)))
    time.sleep(0.5)
    B.release_memory()
    r = busy.result(60)
    assert r.finish_reason is FinishReason.ABORT, "in-flight request was not aborted"
    check(coloc(A, "lend"), "A while B is lent")
    after = gpu_mem()
    return (f"in-flight aborted with {len(r.output_ids)} tokens kept; GPU memory "
            f"{before} -> {after} MiB" if before >= 0 else "no nvidia-smi: memory not measured")


@step("return: resume B, same outputs")
def _():
    B.resume_memory()
    return check(coloc(B, "ret"), "after resume")


@step("weight update by version (disk)")
def _():
    B.load_weights(1, str(new_weights))
    rs = coloc(B, "w1")
    assert all(r.weights_version == 1 for r in rs), "weights_version not reported"
    changed = sum(r.output_ids != want[i] for i, r in enumerate(rs))
    assert changed, "new weights did not change any output"
    return f"{changed}/{len(rs)} outputs changed at version 1"


@step("real sglang-router: colocated and PD routing")
def _():
    from pearl.config import SGLangConfig
    from pearl.engines.sglang import SGLangClient
    procs = launch_routers("127.0.0.1", PORT + 200)
    cfg = SGLangConfig(host="127.0.0.1", port=PORT, bootstrap_port=PORT + 100)
    link = SGLangRouterLink(f"http://127.0.0.1:{PORT + 200}", f"http://127.0.0.1:{PORT + 201}",
                            cfg, processes=procs)
    try:
        B.load_weights(2, str(model))  # both servers on the same weights again

        def run(rid):
            box, ev = [], threading.Event()
            link.submit(GenerateRequest(rid, PROMPTS[1], SP), lambda r, e, _: (box.append((r, e)), ev.set()))
            assert ev.wait(300), "router did not answer"
            assert box[0][0] is not None, box[0][1]
            return box[0][0]

        def table(*rows):
            return {"workers": [{"id": i, "gpus": [e.spec.port - PORT], "role": role,
                                 "activity": "active"} for i, (e, role) in enumerate(rows)]}

        link.update(table((A, "colocated"), (B, "colocated")))
        deadline = time.monotonic() + 60
        while link.mode() != "regular":
            assert time.monotonic() < deadline, "colocated admission timed out"
            time.sleep(0.1)
        r1 = run("rt-c")
        A.set_role(Role.PREFILL)
        B.set_role(Role.DECODE)
        link.update(table((A, "prefill"), (B, "decode")))
        while link.mode() != "pd":
            assert time.monotonic() < deadline + 60, "PD admission timed out"
            time.sleep(0.1)
        r2 = run("rt-pd")
        return f"colocated ok; PD ok (same output: {r1.output_ids == r2.output_ids})"
    finally:
        link.close()


for e in (A, B):
    e.stop()
failed = [n for n, ok, _, _ in results if not ok]
print(f"\n{len(results) - len(failed)} passed, {len(failed)} failed"
      f" ({'facade ' + MODULE if FACADE else 'SGLang'}; logs /tmp/pearl-gpu-check-*.log)")
sys.exit(1 if failed else 0)
EOF
