"""TRL's GRPOTrainer, unmodified, trains through PEARL (pearl.integrations.trl).

One embedded Runtime with torch workers serves the module's torch tests in turn (each TRL run
goes on from the steps and versions the runs before it left): 2 steps with the environment's
fields checked (env_mask, the sampling logprobs); a preemptible worker reclaimed mid-rollout and
one joining; ``async_steps=1``; an agent function written against the openai SDK as the
environment. Then a running pearld (a subprocess). TRL on vLLM workers runs in
tests/engines/vllm/test_vllm_pearl.py, on the servers that module starts anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

trl = pytest.importorskip("trl", reason="the trl extra: pip install -e '.[trl]'")

from transformers import TrainerCallback  # noqa: E402

import pearl  # noqa: E402
from actors import names  # noqa: E402
from pearl.core import events as ev  # noqa: E402
from pearl.core.status import status_plain  # noqa: E402
from pearl.log import FileLog  # noqa: E402
from pearl.testing.wait import poll, wait_until  # noqa: E402

# The torch tests share one runtime (their module fixture stops its actors).
pytestmark = [pytest.mark.slow, pytest.mark.shared_actors]

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
    seq0: int  # the runtime's log position when the run began
    outputs: list[dict[str, Any]] = field(default_factory=list)  # what TRL got, per call
    weights: dict[int, dict[str, Any]] = field(default_factory=dict)  # TRL's model, by version


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


@dataclass
class Torch:
    """The module's runtime on torch workers, the model it serves and TRL trains, its files."""

    rt: Any
    model: Path
    tok: Path
    state: Path
    tmp: Path


@pytest.fixture(scope="module")
def torch_rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Torch]:
    import pykka

    tmp = tmp_path_factory.mktemp("trl-torch")
    model, tok = model_files(tmp)
    sets = (f"engine.torch.preset={model}", "daemon.borrow=always")
    try:
        with runtime(tmp, sets) as rt:
            yield Torch(rt=rt, model=model, tok=tok, state=tmp / "state", tmp=tmp)
    finally:
        pykka.ActorRegistry.stop_all(timeout=10)


class Snapshots(TrainerCallback):
    """TRL's model at the start and after each optimizer step, by the version PEARL gives it."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.run.weights[self.run.rollout.base] = _state(kw["model"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.run.weights[self.run.rollout.base + state.global_step] = _state(kw["model"])


def _state(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def trl_run(
    rt: Any,
    model: Path,
    tok: Path,
    out: Path,
    steps: int = 2,
    batch: int = 8,
    generations: int = 4,
    **kw: Any,
) -> Run:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from pearl.integrations.trl import PearlRollout

    kw.setdefault("max_turns", 2)
    rollout = PearlRollout(rt, env="tool_use_counts", max_new_tokens=16, **kw)
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=batch,
        num_generations=generations,
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
    run = Run(rt=rt, rollout=rollout, trainer=None, seq0=rt.status().seq)

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
        callbacks=[rollout.callback, Snapshots(run)],
    )
    try:
        run.trainer.train()
    finally:
        rollout.close()
    return run


def training_records(state: Path, after: int = 0) -> list[Any]:
    with FileLog(state / "log", readonly=True) as log:
        return [
            r
            for seq, r in log.read()
            if seq > after
            and isinstance(r, ev.TrainingBegin | ev.TrainingFinished | ev.WeightsPublished)
        ]


def check_trained(run: Run, state: Path, steps: int = 2, batch: int = 8) -> None:
    """TRL logged its rewards per step; PEARL's log has, since the run began, TRL's model as
    the base version (on a runtime that had trained), then per step Training Begin, the step's
    weights version and Training Finished."""
    logged = [h for h in run.trainer.state.log_history if "rewards/reward/mean" in h]
    assert [h["step"] for h in logged] == list(range(1, steps + 1))
    assert run.trainer.state.global_step == steps
    kinds = [
        (type(r).__name__, r.version if isinstance(r, ev.WeightsPublished) else r.step)
        for r in training_records(state, run.seq0)
    ]
    base = run.rollout.base
    want = [("WeightsPublished", base)] if base else []
    for k in range(base + 1, base + steps + 1):
        want += [("TrainingBegin", k), ("WeightsPublished", k), ("TrainingFinished", k)]
    assert kinds == want
    assert run.rt.status().weights_version == base + steps
    assert run.rollout.failed == 0
    assert len(run.outputs) == steps
    for out in run.outputs:
        assert len(out["completion_ids"]) == batch
        # TRL's reward is PEARL's: the trajectories' rewards in the environment
        assert out["pearl_reward"] == run.rollout.reward(**out)


def check_logprobs(run: Run, model: Path) -> int:
    """Every generated token's logprob is the engine's under the weights version that sampled
    it (TRL's model at that version, recomputed here), and within the staleness bound of the
    step that trained on it; environment tokens carry 0.0 and version -1. The tokens checked."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model)).eval()
    checked = 0
    for k, out in enumerate(run.outputs, start=run.rollout.base + 1):
        floor = max(run.rollout.base, k - 1 - run.rollout.staleness)
        rows = zip(
            out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"],
            out["pearl_versions"], strict=True,
        )  # fmt: skip
        for p, c, lp, mask, versions in rows:
            on = torch.tensor(mask, dtype=torch.bool)
            v = torch.tensor(versions)
            assert bool((v[~on] == -1).all()) and bool((torch.tensor(lp)[~on] == 0).all())
            assert all(floor <= x <= k - 1 for x in v[on].tolist()), (k, sorted(set(versions)))
            for version in sorted(set(v[on].tolist())):
                m.load_state_dict(run.weights[version])
                seq = torch.tensor([p + c])
                with torch.no_grad():
                    logits = m(input_ids=seq).logits[0, len(p) - 1 : -1].float()
                ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None])[:, 0]
                sel = on & (v == version)
                got = torch.tensor(lp)[sel]
                assert torch.allclose(got, ref[sel], atol=2e-3), (got - ref[sel]).abs().max()
                checked += int(sel.sum())
    return checked


def routable(rt: Any) -> list[Any]:
    return [w for w in rt.status().workers if w.activity == "active" and w.role != "training"]


def same_as_replay(rt: Any, state: Path) -> None:
    def agree() -> bool:
        s = rt.status()
        with FileLog(state / "log", readonly=True) as log:
            t = log.load(s.seq).state.to_json()
        return bool(t["workers"] == status_plain(s)["workers"])

    wait_until(agree, 30, "status == replay")


def _runs(ids: Sequence[int], mask: Sequence[int]) -> list[tuple[int, list[int]]]:
    out: list[tuple[int, list[int]]] = []
    for i, m in zip(ids, mask, strict=True):
        if out and out[-1][0] == m:
            out[-1][1].append(i)
        else:
            out.append((m, [i]))
    return out


def test_grpo_trainer_takes_two_steps_through_pearl(torch_rt: Torch) -> None:
    t = torch_rt
    run = trl_run(t.rt, t.model, t.tok, t.tmp / "plain")
    check_trained(run, t.state)
    first = run.outputs[0]

    # env_mask: 0 exactly on the environment's tokens: each run of 0s is the observation the
    # environment answers to the run of 1s before it, in the chat frame, and nothing else
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

    # logprobs: the engine's, under the version that sampled each token (the model TRL
    # started from, for the first batch)
    assert set(first["pearl_version"]) == {run.rollout.base}
    assert check_logprobs(run, t.model) > 0


def test_async_steps_one_trains_on_rollouts_sampled_a_step_ahead(torch_rt: Torch) -> None:
    """async_steps=1: the batch TRL trains on at step k+1 was started before step k's Training
    Begin (its trajectories are named for the call that started it) and ran on while TRL
    trained; its tokens carry the version that sampled them, within the staleness bound, and
    their logprobs are that version's, so TRL's importance-sampling correction applies."""
    t = torch_rt
    steps = 3
    run = trl_run(t.rt, t.model, t.tok, t.tmp / "async", steps=steps, async_steps=1)
    check_trained(run, t.state, steps=steps)
    started = [
        {re.sub(r"r\d+$", "", x.split(".")[0]) for x in out["pearl_trajectory"]}
        for out in run.outputs
    ]  # the call that started each trajectory (a re-sampled one: the call that re-sampled it)
    # call 1 started its own batch and the next; call k (> 1) returns the batch call k-1
    # started, and starts the next, cancelled at the end
    assert started == [{"pearl-trl-c1"}, {"pearl-trl-c1a1"}, {"pearl-trl-c2"}]
    base = run.rollout.base
    # step 2 trains on tokens of the version before its model's: sampled while TRL was still
    # at step 1, not lost or re-sampled
    step2 = [v for row in run.outputs[1]["pearl_versions"] for v in row if v >= 0]
    assert base in step2 and set(step2) <= {base, base + 1}
    assert check_logprobs(run, t.model) > 0
    ids = [i for out in run.outputs for i in out["pearl_trajectory"]]
    assert len(ids) == len(set(ids)) == 8 * steps  # nothing lost, nothing trained twice


def test_a_reclaim_mid_rollout_and_a_join_lose_no_trajectory(torch_rt: Torch) -> None:
    """A preemptible worker is reclaimed while it holds turns of TRL's rollout, and another
    joins. A turn of 16 tokens can end between the look and the reclaim, so the churn goes on,
    GPU 3 and 4 in turn, until a reclaim has moved a turn (or the run ends: then it fails)."""
    t = torch_rt
    rt = t.rt
    rt.event(ev.GpusAdded(gpus=(3,)))
    wait_until(lambda: any(3 in w.gpus for w in routable(rt)), 60, "the worker on 3", 0.1)
    router = rt.daemon.directory.get(names.ROUTER).ref.proxy()
    migrated0 = router.migrated.get()
    ended = threading.Event()
    serving = [3]  # the preemptible GPU serving now

    def busy(gpu: int) -> bool:  # the worker on ``gpu`` holds turns of TRL's rollout
        on = {w for p in router.pending.get().values() for w in p.workers}
        return any(gpu in w.gpus and w.id in on for w in routable(rt))

    def churn() -> None:
        while router.migrated.get() == migrated0:
            gpu, other = serving[0], 7 - serving[0]
            if not poll(lambda g=gpu: busy(g) or ended.is_set(), 120, 0.005) or ended.is_set():
                return
            rt.event(ev.GpusReclaimed(gpus=(gpu,)))
            rt.event(ev.GpusAdded(gpus=(other,)))
            serving[0] = other
            wait_until(lambda o=other: any(o in w.gpus for w in routable(rt)) or ended.is_set(),
                       60, f"the worker on {other}", 0.01)  # fmt: skip

    th = threading.Thread(target=churn, daemon=True)
    th.start()
    try:
        run = trl_run(rt, t.model, t.tok, t.tmp / "reclaim")
    finally:
        ended.set()
        th.join(60)
    check_trained(run, t.state)
    assert run.rollout.migrations >= 1  # the reclaimed worker's turns moved and finished
    trajectories = [i for out in run.outputs for i in out["pearl_trajectory"]]
    assert len(trajectories) == len(set(trajectories)) == 16
    gpu = serving[0]
    wait_until(lambda: [w for w in routable(rt) if gpu in w.gpus], 60, f"the worker on {gpu}", 0.1)
    assert not [w for w in routable(rt) if 7 - gpu in w.gpus]
    same_as_replay(rt, t.state)


# -- an agent function as the environment ----------------------------------------------------

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "pattern": "^[0-9+*-]{1,5}$"}},
            "required": ["expression"],
        },
    },
}


@dataclass
class Seen:
    """What the agent function got back, per session: each response's token ids, logprobs."""

    turns: dict[str, list[tuple[list[int], list[float]]]] = field(default_factory=dict)
    results: dict[str, str] = field(default_factory=dict)  # the calculator's answer


def counting_agent(model: str, seen: Seen) -> Callable[[Any, Any], float]:
    """The demo's counting task as an agent on the openai SDK: the calculator first
    (``tool_choice="required"``), its result back as a tool message, then the answer; the
    reward is 1 for the right number in it."""
    from pearl.rl.envs.sandbox import run_tool

    def agent(client: Any, task: Any) -> float:
        session = client.default_headers["X-Session-ID"]
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
        got = seen.turns.setdefault(session, [])

        def turn(**kw: Any) -> Any:
            r = client.chat.completions.create(
                model=model, messages=messages, tools=[CALCULATOR], **kw
            )
            c = r.choices[0]
            got.append((c.model_extra["token_ids"], [x.logprob for x in c.logprobs.content]))
            return c.message

        call = turn(tool_choice="required", max_tokens=96)
        messages.append(call.model_dump(exclude_none=True))
        for tc in call.tool_calls or []:
            expr = json.loads(tc.function.arguments)["expression"]
            out = asyncio.run(run_tool("calc", expr)).output
            seen.results[session] = out
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": out})
        answer = turn(max_tokens=8).content or ""
        return 1.0 if task.answer in answer else 0.0

    return agent


def test_an_agent_function_is_the_environment(torch_rt: Torch) -> None:
    """PearlRollout(rt, agent=fn): TRL's fields come from what the gateway served the agent's
    session. The model's tokens are exactly the responses' (env_mask 1), the rest the rendered
    tool result between them (0), and the logprobs are the engine's."""
    import openai

    from pearl.rl.prompt import PromptBuilder
    from pearl.tokenizer import ByteTokenizer

    t = torch_rt
    model = openai.OpenAI(base_url=t.rt.gateway_url, api_key="none").models.list().data[0].id
    seen = Seen()
    run = trl_run(
        t.rt, t.model, t.tok, t.tmp / "agent", steps=1, batch=4, generations=2,
        agent=counting_agent(model, seen),
    )  # fmt: skip
    check_trained(run, t.state, steps=1, batch=4)
    (out,) = run.outputs
    b = PromptBuilder(ByteTokenizer(), max_len=1024)
    for ids, mask, session in zip(
        out["completion_ids"], out["env_mask"], out["pearl_trajectory"], strict=True
    ):
        (call, _), (answer, _) = seen.turns[session]
        runs = _runs(ids, mask)
        assert [v for v, _ in runs] == [1, 0, 1]
        assert runs[0][1] == call and runs[2][1] == answer
        between = b.decode(runs[1][1])
        assert f"<tool_response>\n{seen.results[session]}\n</tool_response>" in between
        assert between.endswith("<|im_start|>assistant\n")
    got = {s: [lp for _, lps in turns for lp in lps] for s, turns in seen.turns.items()}
    for lps, mask, session in zip(
        out["logprobs"], out["env_mask"], out["pearl_trajectory"], strict=True
    ):
        assert [lp for lp, m in zip(lps, mask, strict=True) if m] == got[session]
    assert check_logprobs(run, t.model) > 0


def test_an_agent_that_rewrites_its_history_is_refused(torch_rt: Torch) -> None:
    """A session whose second prompt does not extend the first turn (the agent dropped the
    model's answer) cannot be one training sequence: HistoryRewritten names the turn; a
    streamed or n > 1 request is refused before it reaches the gateway."""
    import openai

    from pearl.integrations.agent import AgentError, AgentSession, HistoryRewritten

    url = torch_rt.rt.gateway_url
    model = openai.OpenAI(base_url=url, api_key="none").models.list().data[0].id
    s = AgentSession(url, "rewrites")
    ask = {"model": model, "max_tokens": 4}
    s.client.chat.completions.create(messages=[{"role": "user", "content": "2+2?"}], **ask)
    s.client.chat.completions.create(messages=[{"role": "user", "content": "3+3?"}], **ask)
    with pytest.raises(HistoryRewritten, match="turn 1's prompt does not extend turn 0's"):
        s.trajectory(trajectory_id="t", group_id="g", task_id="x", reward=0.0)
    s.close()

    s = AgentSession(url, "streams")
    for kw in ({"stream": True}, {"n": 2}):
        with pytest.raises(openai.BadRequestError):
            s.client.chat.completions.create(
                messages=[{"role": "user", "content": "hi"}], **ask, **kw
            )
    with pytest.raises(AgentError, match="not streamed"):
        s.trajectory(trajectory_id="t", group_id="g", task_id="x", reward=0.0)
    s.close()


# -- a running pearld --------------------------------------------------------------------------


def test_a_running_pearld(tmp_path: Path) -> None:
    """PearlRollout given pearld's endpoint and its gateway's URL instead of a Runtime."""
    from pearl.testing.pearld import Pearld, free_port

    model, tok = model_files(tmp_path)
    port = free_port()
    d = Pearld(
        tmp_path,
        [*BASE, f"gateway.listen=127.0.0.1:{port}", f"engine.torch.preset={model}"],
        config=ROOT / "configs" / "local-cpu.toml",
    )
    try:
        d.start()
        rt = pearl.connect(d.endpoint, timeout_s=5.0)
        wait_until(lambda: routable(rt), 120, "a rollout worker", 0.1)
        run = trl_run(
            rt, model, tok, tmp_path / "out", steps=1, batch=4, generations=2,
            gateway=f"http://127.0.0.1:{port}/v1", tokenizer=str(model),
        )  # fmt: skip
        check_trained(run, d.state, steps=1, batch=4)
        assert check_logprobs(run, model) > 0
        rt.stop()
    finally:
        d.cleanup()  # pearld and its worker hosts, by pid
