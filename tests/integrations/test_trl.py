"""TRL's GRPOTrainer, unmodified, trains through PEARL (pearl.integrations.trl): 2-step runs on
an embedded Runtime with torch workers (plain; with a preemptible worker reclaimed mid-rollout
and one joining), the fields TRL gets (env_mask, sampling logprobs), and vLLM workers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

trl = pytest.importorskip("trl", reason="the trl extra: pip install -e '.[trl]'")

import pearl  # noqa: E402
from actors import names  # noqa: E402
from pearl.core import events as ev  # noqa: E402
from pearl.core.status import status_plain  # noqa: E402
from pearl.log import FileLog  # noqa: E402
from pearl.testing.wait import wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BASE = (
    "rl.env=",  # no rollout pipeline of PEARL's own: TRL's prompts are the only traffic
    "gateway.listen=127.0.0.1:0",
    "daemon.pd=colocated",
)


@dataclass
class Run:
    rt: Any
    rollout: Any
    trainer: Any
    outputs: list[dict[str, Any]] = field(default_factory=list)  # what TRL got, per call


def model_files(tmp: Path, preset: str = "tiny") -> tuple[Path, Path]:
    """The preset's seeded weights as a model directory, and the byte tokenizer beside it."""
    from pearl.engines.vllm.checkpoint import byte_tokenizer, preset_dir

    model = preset_dir(preset, 0, tmp / f"{preset}-model")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    return model, byte_tokenizer(tmp / f"byte-tokenizer-{vocab}", vocab)


@contextlib.contextmanager
def runtime(tmp: Path, sets: Sequence[str], config: str = "local-cpu.toml") -> Iterator[Any]:
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / config, state_dir=tmp / "state", overrides=(*BASE, *sets)
    )
    seen: set[int] = set()
    try:
        rt.start()
        yield rt
    finally:
        seen |= host_pids(tmp / "state")
        with contextlib.suppress(Exception):
            rt.stop()
        for pid in seen | host_pids(tmp / "state"):  # whatever a failure left behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def host_pids(state: Path) -> set[int]:
    pids = set()
    for f in (state / "workers").glob("worker-*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pids.add(int(f.read_text()))
    return pids


def trl_run(rt: Any, model: Path, tok: Path, out: Path, steps: int = 2, **kw: Any) -> Run:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from pearl.integrations.trl import PearlRollout

    rollout = PearlRollout(rt, env="tool_use_counts", max_turns=2, max_new_tokens=16, **kw)
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=8,
        num_generations=4,
        max_steps=steps,
        learning_rate=1e-3,
        beta=0.0,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    run = Run(rt=rt, rollout=rollout, trainer=None)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        fields = rollout(prompts, trainer)  # the real rollout; its answer is kept for checks
        run.outputs.append(fields)
        return fields

    run.trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(model)),
        reward_funcs=rollout.reward,
        args=args,
        train_dataset=rollout.dataset(32),
        processing_class=AutoTokenizer.from_pretrained(str(tok)),
        rollout_func=rollout_func,
        callbacks=[rollout.callback],
    )
    try:
        run.trainer.train()
    finally:
        rollout.close()
    return run


def training_records(state: Path) -> list[Any]:
    with FileLog(state / "log", readonly=True) as log:
        return [
            r
            for _, r in log.read()
            if isinstance(r, ev.TrainingBegin | ev.TrainingFinished | ev.WeightsPublished)
        ]


def check_trained(run: Run, state: Path, steps: int = 2) -> None:
    """TRL logged its rewards per step; PEARL's log has the Begin/Finished pairs, the versions."""
    logged = [h for h in run.trainer.state.log_history if "rewards/reward/mean" in h]
    assert [h["step"] for h in logged] == list(range(1, steps + 1))
    assert run.trainer.state.global_step == steps
    kinds = [
        (type(r).__name__, getattr(r, "step", None) or getattr(r, "version", None))
        for r in training_records(state)
    ]
    want = []
    for k in range(1, steps + 1):
        want += [("TrainingBegin", k), ("WeightsPublished", k), ("TrainingFinished", k)]
    assert kinds == want
    assert run.rt.status().weights_version == steps
    assert run.rollout.failed == 0
    for out in run.outputs:
        assert len(out["completion_ids"]) == 8
        # TRL's reward is PEARL's: the trajectories' rewards in the environment
        assert out["pearl_reward"] == run.rollout.reward(**out)


def routable(rt: Any) -> list[Any]:
    return [w for w in rt.status().workers if w.activity == "active" and w.role != "training"]


def same_as_replay(rt: Any, state: Path) -> None:
    def agree() -> bool:
        s = rt.status()
        with FileLog(state / "log", readonly=True) as log:
            t = log.load(s.seq).state.to_json()
        return bool(t["workers"] == status_plain(s)["workers"])

    wait_until(agree, 30, "status == replay")


@pytest.mark.slow
def test_grpo_trainer_takes_two_steps_through_pearl(tmp_path: Path) -> None:
    model, tok = model_files(tmp_path)
    with runtime(tmp_path, (f"engine.torch.preset={model}",)) as rt:
        run = trl_run(rt, model, tok, tmp_path / "out")
        check_trained(run, tmp_path / "state")
        first = run.outputs[0]

    # env_mask: 0 exactly on the environment's tokens: each run of 0s is the observation the
    # environment answers to the run of 1s before it, in the chat frame, and nothing else
    import asyncio

    from pearl.rl.env import make_env
    from pearl.rl.prompt import PromptBuilder
    from pearl.tokenizer import ByteTokenizer

    b = PromptBuilder(ByteTokenizer(), max_len=1024)
    pre, _, post = b.t.user_fmt.partition("{text}")

    async def observations(task_id: str, actions: list[str]) -> list[str]:
        env = make_env("tool_use_counts", max_turns=2)
        await env.reset(run.rollout._ran[task_id])
        try:
            return [(await env.step(a)).observation for a in actions]
        finally:
            await env.close()

    env_tokens = 0
    for ids, mask, task in zip(
        first["completion_ids"], first["env_mask"], first["task_id"], strict=True
    ):
        assert len(ids) == len(mask)
        runs = _runs(ids, mask)
        acts = [b.decode(part) for value, part in runs if value == 1]
        env = [b.decode(part) for value, part in runs if value == 0]
        assert [v for v, _ in runs] == [1, 0] * len(env) + [1]
        seen = asyncio.run(observations(task, acts[: len(env)]))
        for text, obs in zip(env, seen, strict=True):
            assert text.removeprefix(b.t.assistant_end) == pre + obs + post
        env_tokens += sum(len(part) for value, part in runs if value == 0)
    assert env_tokens > 0  # two turns: the environment answered between them

    # logprobs: the engine's, under version 0 (the model TRL started from), on generated ids
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model)).eval()
    assert set(first["pearl_version"]) == {0}
    for p, c, lp, mask in zip(
        first["prompt_ids"], first["completion_ids"], first["logprobs"], first["env_mask"],
        strict=True,
    ):  # fmt: skip
        seq = torch.tensor([p + c])
        with torch.no_grad():
            logits = m(input_ids=seq).logits[0, len(p) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None])[:, 0]
        got = torch.tensor(lp)
        on = torch.tensor(mask, dtype=torch.bool)
        assert torch.allclose(got[on], ref[on], atol=2e-3), (got[on] - ref[on]).abs().max()
        assert bool((got[~on] == 0).all())


def _runs(ids: Sequence[int], mask: Sequence[int]) -> list[tuple[int, list[int]]]:
    out: list[tuple[int, list[int]]] = []
    for i, m in zip(ids, mask, strict=True):
        if out and out[-1][0] == m:
            out[-1][1].append(i)
        else:
            out.append((m, [i]))
    return out


@pytest.mark.slow
def test_a_reclaim_mid_rollout_and_a_join_lose_no_trajectory(tmp_path: Path) -> None:
    model, tok = model_files(tmp_path)
    sets = (f"engine.torch.preset={model}", "daemon.borrow=always")
    with runtime(tmp_path, sets) as rt:
        rt.event(ev.GpusAdded(gpus=(3,)))
        wait_until(lambda: any(3 in w.gpus for w in routable(rt)), 60, "the worker on 3", 0.1)
        router = rt.daemon.directory.get(names.ROUTER).ref.proxy()
        moved: list[str] = []

        def busy() -> bool:  # the worker on GPU 3 holds turns of TRL's rollout
            on = {w for p in router.pending.get().values() for w in p.workers}
            return any(3 in w.gpus and w.id in on for w in routable(rt))

        def churn() -> None:
            wait_until(busy, 120, "a turn in flight on the worker on 3", every=0.005)
            rt.event(ev.GpusReclaimed(gpus=(3,)))
            rt.event(ev.GpusAdded(gpus=(4,)))
            moved.append("done")

        t = threading.Thread(target=churn, daemon=True)
        t.start()
        run = trl_run(rt, model, tok, tmp_path / "out")
        t.join(60)
        assert moved == ["done"]
        check_trained(run, tmp_path / "state")
        assert run.rollout.migrations >= 1  # the reclaimed worker's turns moved and finished
        trajectories = [i for out in run.outputs for i in out["pearl_trajectory"]]
        assert len(trajectories) == len(set(trajectories)) == 16
        wait_until(lambda: [w for w in routable(rt) if 4 in w.gpus], 60, "the worker on 4", 0.1)
        assert not [w for w in routable(rt) if 3 in w.gpus]
        same_as_replay(rt, tmp_path / "state")


@pytest.mark.slow
def test_vllm_workers(tmp_path: Path) -> None:
    venv = ROOT / ".venv-vllm" / "bin" / "python"
    if not venv.exists():
        pytest.skip(f"no vLLM environment at {venv.parent.parent}: `make vllm` creates it")
    from tests.ports import free_base

    model, tok = model_files(tmp_path, "tiny32")
    sets = (
        f"engine.torch.preset={model}",
        f"engine.vllm.model_path={model}",
        f"engine.vllm.tokenizer={tok}",
        f"engine.vllm.python={venv}",
        f"engine.vllm.port={free_base(8)}",
        "engine.vllm.max_model_len=512",
    )
    with runtime(tmp_path, sets, config="local-vllm.toml") as rt:
        run = trl_run(rt, model, tok, tmp_path / "out", max_len=512)
        check_trained(run, tmp_path / "state")
