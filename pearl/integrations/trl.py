"""TRL's ``GRPOTrainer`` on PEARL: its ``rollout_func``, a reward function and a callback.

    rollout = PearlRollout(rt, env="tool_use_counts", max_turns=4)
    trainer = GRPOTrainer(model=..., reward_funcs=rollout.reward, args=GRPOConfig(...),
                          train_dataset=rollout.dataset(256), rollout_func=rollout,
                          callbacks=[rollout.callback])

TRL keeps the loss, the optimizer and the model; PEARL runs the rollouts on the elastic pool.
Each completion TRL asks for is one PEARL trajectory, in one of two environments:

- ``env``, a :class:`~pearl.rl.env.Environment` (a registered name or a factory):
  :func:`pearl.rl.rollout.run_trajectory`, every turn generated through the gateway's
  ``/generate`` (:mod:`pearl.integrations.generate`);
- ``agent``, an agent function ``fn(client, task) -> reward`` written against the OpenAI API:
  ``client`` is an ``openai.OpenAI`` on the gateway whose requests are the trajectory's session,
  and the trajectory is recovered token for token from what the gateway served it
  (:mod:`pearl.integrations.agent`: its rules, and what it refuses). It runs in a thread of its
  own; ``env`` then only names the task set :meth:`PearlRollout.dataset` draws from.

TRL gets, per trajectory:

- ``prompt_ids``: the first turn's prompt; ``completion_ids``: every later token, generated or
  appended by the environment, in order;
- ``env_mask``: 1 on generated tokens, 0 on the environment's (observations, chat markers);
- ``logprobs``: per completion token, the logprob under the weights version that sampled it (0.0
  on the environment's tokens);
- ``pearl_versions``: per completion token, the weights version that sampled it (-1 on the
  environment's);
- ``pearl_reward`` (what :meth:`PearlRollout.reward` returns), ``pearl_version`` (the oldest
  version that generated a token), ``pearl_trajectory`` and ``task_id``.

Step boundaries (TRL's step k = its ``global_step`` + 1 while it computes; PEARL's step and
weights version for it are ``base`` + k):

- Training Begin(base + k) once the rollouts TRL trains on are in, before ``rollout_func``
  returns: the forward and backward passes that follow run only after every lent training slot
  is back;
- weights version base + k published and Training Finished(base + k) after TRL's optimizer step
  (``on_step_end``): the pool may lend the slots again, serving workers move to it, joiners start
  from it.

``base`` is 0 on a runtime that has neither trained nor published (its workers serve the model
TRL starts from, as configured). On one that has (a running pearld, an earlier trainer), steps
and versions must go on rising, and its workers serve another trainer's weights: ``base`` is
one more than its training step and weights version, and the first call publishes TRL's model
as version ``base`` before any rollout, so that every token TRL trains on was sampled by a
version of its own run (older ones are sampled again).

``async_steps`` = K > 0: a call returns the rollouts started K calls before, and starts those of
the prompts it was given, which run while TRL trains. TRL reveals a step's prompts only when it
calls ``rollout_func``, so the first call also starts K more samplings of its own prompts; the
last K batches started are cancelled when training ends. A batch holds tokens of versions
>= k - 1 - K at step k; K must be within the runtime's staleness bound, and a batch older than
the bound is sampled again rather than trained on.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from pearl.core.errors import ConfigError
from pearl.engines.base import SamplingParams
from pearl.integrations.agent import AgentError, AgentFn, AgentSession, HistoryRewritten
from pearl.integrations.generate import GatewayGenerate
from pearl.rl.env import Environment, Task, TaskSet, make_env, make_tasks
from pearl.rl.prompt import PromptBuilder
from pearl.rl.rollout import run_trajectory
from pearl.rl.trajectory import Trajectory
from pearl.rl.weights import cpu_state
from pearl.runtime import RemoteRuntime, Runtime, connect
from pearl.tokenizer import Tokenizer, load_tokenizer

EnvLike = str | Callable[[], Environment]


@dataclass(frozen=True)
class StepRecord:
    """One training step as PEARL saw it."""

    step: int
    return_s: float  # Training Begin -> every lent slot back
    min_version: int  # the oldest weights version in the batch trained on
    resampled: int  # trajectories sampled again (older than the staleness bound)
    # The borrow cycle of the idle window before this step, if the pool lent training slots:
    # workers activated on them, and seconds they served rollout before Training Begin.
    lent: int = 0
    served_s: float | None = None


class PearlRollout:
    """TRL's ``rollout_func`` over PEARL's elastic pool (see the module's docstring)."""

    def __init__(
        self,
        runtime_or_endpoint: Runtime | RemoteRuntime | str,
        env: EnvLike = "tool_use_counts",
        *,
        agent: AgentFn | None = None,
        agent_threads: int = 64,
        max_turns: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        tasks: Sequence[Task] | None = None,
        gateway: str | None = None,
        api_key: str | None = None,
        tokenizer: Tokenizer | str | None = None,
        max_len: int | None = None,
        max_new_tokens: int = 48,
        async_steps: int = 0,
        staleness: int | None = None,
        seed: int = 0,
        retries: int = 3,
    ) -> None:
        rt = runtime_or_endpoint
        self.rt = connect(rt) if isinstance(rt, str) else rt
        cfg = getattr(self.rt, "cfg", None)  # an embedded Runtime's config
        if gateway is None and isinstance(self.rt, Runtime):
            gateway = self.rt.gateway_url
        if not gateway:
            raise ConfigError(
                "PearlRollout generates through PEARL's gateway: set [gateway] listen in the "
                "runtime's config (e.g. --set gateway.listen=127.0.0.1:0), or pass gateway= "
                "with a running pearld's gateway URL"
            )
        self.gateway, self.api_key = gateway, api_key
        if tokenizer is None and cfg is not None and "/" in cfg.engine.torch.preset:
            tokenizer = cfg.engine.torch.preset
        tok = tokenizer if not isinstance(tokenizer, str | Path | None) else None
        self.builder = PromptBuilder(
            tok or load_tokenizer(tokenizer),  # type: ignore[arg-type]
            max_len=max_len or (cfg.workload.max_trajectory_tokens if cfg else 1024),
        )
        self.staleness = (
            staleness if staleness is not None else (cfg.workload.staleness if cfg else 1)
        )
        if not 0 <= async_steps <= self.staleness:
            raise ConfigError(
                f"async_steps={async_steps} must be within 0..staleness ({self.staleness}): "
                "a batch started that many steps ahead would be too old to train on"
            )
        self.env, self.async_steps, self.seed, self.retries = env, async_steps, seed, retries
        self.env_kwargs = dict(env_kwargs or {})
        if max_turns is not None:
            self.env_kwargs["max_turns"] = max_turns
        self.max_new_tokens = max_new_tokens
        self.agent = agent
        self._agents = (
            concurrent.futures.ThreadPoolExecutor(agent_threads, thread_name_prefix="pearl-agent")
            if agent is not None
            else None
        )
        self._agent_migrations = 0
        self._agent_lock = threading.Lock()
        self._tasks: dict[str, Task] = {}  # by prompt: what TRL's prompts stand for
        self._ran: dict[str, Task] = {}  # by id: the tasks rolled out
        if tasks is not None:
            self._index(tasks)
        self.records: list[StepRecord] = []
        self.failed = 0  # trajectories that raised (each was sampled again)
        self.cancelled = 0  # trajectories started ahead and cancelled when training ended
        self._pending: collections.deque[concurrent.futures.Future[list[Trajectory]]] = (
            collections.deque()
        )
        self._window: Any = None  # the open rt.training() context, Begin sent, Finished not
        self._calls = 0
        s = self.rt.status()
        fresh = s.training_step == 0 and s.weights_version == 0
        self.base = 0 if fresh else max(s.training_step, s.weights_version) + 1
        self._published_base = fresh
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pearl-trl", daemon=True
        )
        self._thread.start()
        self._generate: GatewayGenerate = self._run(self._connect())
        self.callback = PearlCallback(self)

    # -- tasks -------------------------------------------------------------------------------

    def dataset(self, n: int = 256, seed: int | None = None) -> Any:
        """A ``datasets.Dataset`` of the environment's task prompts (column ``prompt``), whose
        tasks this rollout knows by prompt. Needs a registered environment name."""
        from datasets import Dataset

        if not isinstance(self.env, str):
            raise ConfigError("dataset() needs env as a registered name; pass tasks= instead")
        ts = make_tasks(self.env, n=n, seed=self.seed if seed is None else seed)
        self._index(ts)
        return Dataset.from_dict({"prompt": [t.prompt for t in ts]})

    def _index(self, tasks: Sequence[Task] | TaskSet) -> None:
        for t in tasks:
            self._tasks.setdefault(t.prompt, t)

    def task_of(self, prompt: Any) -> Task:
        """The task a TRL prompt stands for: a known task's, else a task with no answer."""
        text = prompt if isinstance(prompt, str) else str(prompt[-1]["content"])
        known = self._tasks.get(text)
        return known or Task(id=f"prompt-{zlib.crc32(text.encode()):08x}", prompt=text)

    # -- TRL's rollout_func --------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Rollouts for ``prompts`` (one trajectory per prompt entry; TRL repeats each prompt
        ``num_generations`` times), then Training Begin when TRL trains on them."""
        training = bool(trainer.model.training)
        step = self.base + int(trainer.state.global_step) + 1
        if not self._published_base:  # TRL's model, before anything samples for it
            self.rt.publish_weights(cpu_state(_unwrapped(trainer.model)), self.base)
            self._published_base = True
        args = trainer.args
        sampling = SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=float(args.temperature),
            top_p=float(getattr(args, "top_p", 1.0) or 1.0),
            seed=int(args.seed),
        )
        tasks = [self.task_of(p) for p in prompts]
        self._calls += 1
        tag = f"c{self._calls}"
        if not training or self.async_steps == 0:
            batch = self._submit(tasks, sampling, tag).result()
        else:
            self._pending.append(self._submit(tasks, sampling, tag))
            while len(self._pending) < self.async_steps + 1:  # the first call: nothing ahead
                self._pending.append(self._submit(tasks, sampling, f"{tag}a{len(self._pending)}"))
            batch = self._pending.popleft().result()
        resampled = 0
        if training:
            # TRL's model is at version step - 1; none before base is of this run
            floor = max(step - 1 - self.staleness, self.base)
            for attempt in range(self.retries + 1):  # workers move to a version lazily
                stale = [i for i, t in enumerate(batch) if 0 <= t.min_version < floor]
                if not stale:
                    break
                redo = [self._ran[batch[i].task_id] for i in stale]
                again = self._submit(redo, sampling, f"{tag}r{attempt}")
                for i, t in zip(stale, again.result(), strict=True):
                    batch[i] = t
                resampled += len(stale)
            self._begin(step, batch, resampled)
        return self.fields(batch)

    def fields(self, batch: Sequence[Trajectory]) -> dict[str, list[Any]]:
        """TRL's fields for ``batch``, in its order."""
        out: dict[str, list[Any]] = {
            k: []
            for k in (
                "prompt_ids",
                "completion_ids",
                "logprobs",
                "env_mask",
                "pearl_versions",
                "pearl_reward",
                "pearl_version",
                "pearl_trajectory",
                "task_id",
            )
        }
        for t in batch:
            first = t.turns[0]
            ids, mask, lps = t.tokens(), t.loss_mask(), t.rollout_logprobs()
            k = len(first.prompt_ids)
            out["prompt_ids"].append(list(ids[:k]))
            out["completion_ids"].append(list(ids[k:]))
            out["env_mask"].append(list(mask[k:]))
            out["logprobs"].append(list(lps[k:]))
            out["pearl_versions"].append(list(t.token_versions()[k:]))
            out["pearl_reward"].append(float(t.reward))
            out["pearl_version"].append(t.min_version)
            out["pearl_trajectory"].append(t.id)
            out["task_id"].append(t.task_id)
        return out

    def reward(self, prompts: Any = None, completions: Any = None, **kwargs: Any) -> list[float]:
        """TRL reward function: each trajectory's reward in the environment (the sum of its
        steps' rewards)."""
        return [float(r) for r in kwargs["pearl_reward"]]

    # -- the step boundary --------------------------------------------------------------------

    def _begin(self, step: int, batch: Sequence[Trajectory], resampled: int) -> None:
        if self._window is not None:  # a step TRL abandoned: close it before the next
            self._window.__exit__(None, None, None)
        self._window = self.rt.training(step, weights_version=step)
        self._window.__enter__()  # returns once every lent training slot is back
        return_s = float(self.rt.last_return_s)
        cycle = self.rt.status().borrow.current
        if cycle is not None and cycle.step != step - 1:
            cycle = None  # not the window before this step
        versions = [t.min_version for t in batch if t.n_generated]
        self.records.append(
            StepRecord(
                step=step,
                return_s=return_s,
                min_version=min(versions) if versions else -1,
                resampled=resampled,
                lent=cycle.activated if cycle else 0,
                served_s=cycle.served_s if cycle else None,
            )
        )

    def finish_step(self, global_step: int, model: Any) -> None:
        """After TRL's optimizer step ``global_step``: publish the weights as version
        ``base + global_step``, then Training Finished."""
        if self._window is None:
            return
        self.rt.publish_weights(cpu_state(_unwrapped(model)), self.base + global_step)
        window, self._window = self._window, None
        window.__exit__(None, None, None)

    def close(self) -> None:
        """Cancel the batches started ahead, close an open step, stop the rollout thread."""
        while self._pending:
            fut = self._pending.popleft()
            if fut.cancel() or not fut.done():
                self.cancelled += 1
        if self._window is not None:
            window, self._window = self._window, None
            window.__exit__(None, None, None)
        if self._thread.is_alive():
            self._run(self._generate.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)
        if self._agents is not None:
            self._agents.shutdown(wait=False, cancel_futures=True)

    # -- the rollout thread -------------------------------------------------------------------

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _connect(self) -> GatewayGenerate:
        return GatewayGenerate(self.gateway, api_key=self.api_key)

    @property
    def migrations(self) -> int:
        """Turns that moved to another worker mid-generation (a reclaim, a return)."""
        return self._generate.migrations + self._agent_migrations

    def _submit(
        self, tasks: Sequence[Task], sampling: SamplingParams, tag: str
    ) -> concurrent.futures.Future[list[Trajectory]]:
        self._ran.update((t.id, t) for t in tasks)
        return asyncio.run_coroutine_threadsafe(self._batch(tasks, sampling, tag), self._loop)

    async def _batch(
        self, tasks: Sequence[Task], sampling: SamplingParams, tag: str
    ) -> list[Trajectory]:
        return list(
            await asyncio.gather(
                *(self._one(t, sampling, f"{tag}.{i}") for i, t in enumerate(tasks))
            )
        )

    async def _one(self, task: Task, sampling: SamplingParams, tid: str) -> Trajectory:
        for attempt in range(self.retries + 1):
            trajectory_id = f"pearl-trl-{tid}.{attempt}"
            try:
                if self.agent is not None:
                    return await asyncio.get_running_loop().run_in_executor(
                        self._agents, self._agent_trajectory, task, sampling, trajectory_id
                    )
                env = self.env() if callable(self.env) else make_env(self.env, **self.env_kwargs)
                return await run_trajectory(
                    env=env,
                    task=task,
                    generate=self._generate,
                    builder=self.builder,
                    trajectory_id=trajectory_id,
                    group_id=task.id,
                    sampling=sampling,
                )
            except HistoryRewritten:
                raise  # the agent's doing: sampling it again would not change it
            except Exception:
                self.failed += 1
                if attempt == self.retries:
                    raise
        raise AssertionError("unreachable")

    def _agent_trajectory(
        self, task: Task, sampling: SamplingParams, trajectory_id: str
    ) -> Trajectory:
        """One run of the agent function, as a trajectory (in an agent thread)."""
        assert self.agent is not None
        session = AgentSession(
            self.gateway,
            trajectory_id,
            api_key=self.api_key,
            defaults={"temperature": sampling.temperature, "top_p": sampling.top_p},
        )
        try:
            reward = self.agent(session.client, task)
            if not isinstance(reward, int | float):
                raise AgentError(f"the agent function returned {reward!r}, not a reward")
            return session.trajectory(
                trajectory_id=trajectory_id,
                group_id=task.id,
                task_id=task.id,
                reward=float(reward),
                decode=self.builder.decode,
            )
        finally:
            with self._agent_lock:
                self._agent_migrations += session.migrations
            session.close()


def _unwrapped(model: Any) -> Any:
    return getattr(model, "module", model)


class PearlCallback(TrainerCallback):
    """Publishes each optimizer step's weights and sends Training Finished (``on_step_end``)."""

    def __init__(self, rollout: PearlRollout) -> None:
        self.rollout = rollout

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.rollout.finish_step(int(state.global_step), kwargs["model"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.rollout.close()


__all__ = ["PearlCallback", "PearlRollout", "StepRecord"]
