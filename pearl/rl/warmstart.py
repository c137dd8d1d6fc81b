"""A supervised warm start on demonstrations the environment itself generates, cached on disk.

A randomly initialised tiny byte-level model never finds a rewarded answer, so GRPO has no signal.
:func:`ensure` gives it a start: the environment records correct tool-call transcripts (the
expert's tool call, the sandbox's real result, the answer) for a few hundred tasks, none of them
in the held-out set; the model is trained on the generated tokens of those transcripts (the same
token layout the rollout produces, :class:`~pearl.rl.prompt.PromptBuilder`) until it reproduces
``target`` of a validation set of demonstrations, then saved as a local model directory that the
torch engine and the trainer load (``engine.torch.preset = <dir>``). The directory is keyed by
everything that shapes it (preset, environment, task seeds, demonstrations, optimiser), so the
second run loads it in a second.

What is left for GRPO (see docs/learning.md): demonstrations call the Python tool for
``python_share`` of the tasks and the calculator for the rest, while the RL environment has the
Python tool off, so the warm-started policy solves some tasks and not most, and learns from
reward which tool to call.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pearl.core.errors import PearlError
from pearl.rl.env import Task, make_env, make_tasks
from pearl.rl.trajectory import Trajectory, Turn

if TYPE_CHECKING:
    from pearl.rl.prompt import PromptBuilder

FORMAT = 3  # bump when what is cached changes meaning (3: the cooldown keeps its best check)
DEMO_SEED, VALIDATION_SEED, HELD_OUT_SEED = 20_000, 30_000, 10_000


class WarmStartError(PearlError):
    """The warm start could not produce demonstrations or a model."""


@dataclass(frozen=True)
class WarmStartConfig:
    env: str = "tool_use_counts"
    preset: str = "tiny"
    seed: int = 0  # the run's seed: task sets, initial weights, batch order
    train_tasks: int = 256  # the RL task set (rl.tasks), so that the held-out set avoids it
    held_out: int = 64  # held-out tasks (rl eval set); demonstrations never use one
    max_len: int = 1024  # workload.max_trajectory_tokens
    max_turns: int = 4
    demos: int = 400
    validation: int = 64
    python_share: float = 2 / 3  # demonstrations that call the Python tool, not the calculator
    batch: int = 16
    lr: float = 1e-2
    warmup_steps: int = 20
    max_steps: int = 1500
    check_every: int = 25
    target: float = 0.9  # share of validation demonstrations reproduced (tool choice aside)
    # Once at the target, this many more steps with the learning rate decaying linearly to 0: at
    # lr 1e-2 the tool-choice bias follows the last few batches (measured: P(Python) 0.42 on the
    # held-out prompts where the demonstrations have 0.67), so without it the starting policy's
    # greedy tool was a coin toss between runs that differ only in floating-point rounding.
    cooldown_steps: int = 150
    init_std: float = 0.02  # a standard init; the preset's 0.25 suits random-output tests

    def key(self) -> str:
        blob = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
        return f"{self.preset}-{self.env}-s{self.seed}-{digest}"


@dataclass(frozen=True)
class WarmStart:
    path: Path  # a local model directory (config.json + model.safetensors)
    cached: bool
    seconds: float  # to train it, or to find it in the cache
    meta: dict[str, Any]


# -- task sets ---------------------------------------------------------------------------------


def distinct(candidates: Sequence[Task], n: int, exclude: set[str], what: str) -> list[Task]:
    """The first ``n`` tasks whose prompt is neither in ``exclude`` nor seen before."""
    out: list[Task] = []
    seen = set(exclude)
    for t in candidates:
        if t.prompt not in seen:
            seen.add(t.prompt)
            out.append(t)
            if len(out) == n:
                return out
    raise WarmStartError(f"only {len(out)} distinct {what} tasks of {n} wanted; use fewer")


def held_out_tasks(env: str, n: int, seed: int, train_tasks: int) -> list[Task]:
    """The fixed held-out set of run ``seed``: ``n`` tasks none of which is a training task."""
    train = {t.prompt for t in make_tasks(env, n=train_tasks, seed=seed)}
    pool = make_tasks(env, n=8 * n + 64, seed=HELD_OUT_SEED + seed)
    return distinct(candidates=pool, n=n, exclude=train, what="held-out")


# -- demonstrations ----------------------------------------------------------------------------


async def demonstrate(
    env_name: str, task: Task, tool: str, builder: PromptBuilder, max_turns: int, tries: int = 3
) -> Trajectory:
    """One correct transcript of ``task`` recorded in the environment (both tools on): the
    expert's tool call, the sandbox's real result, the answer. A transcript whose tool did not
    return the answer (a sandbox timeout on a busy machine) is recorded again."""
    from pearl.rl.envs.tool_use import expert_actions

    eos = builder.stop_ids
    for _ in range(tries):
        env = make_env(env_name, max_turns=max_turns, python_tool=True)
        try:
            new: tuple[int, ...] | None = builder.first(await env.reset(task))
            traj = Trajectory(id=f"demo-{task.id}", group_id="demo", task_id=task.id)
            observations = []
            for action in expert_actions(task, tool):
                assert new is not None
                out = (*builder.tok.encode(action), *eos)
                traj = traj.add_turn(
                    Turn(
                        prompt_ids=new,
                        output_ids=out,
                        logprobs=(0.0,) * len(out),
                        weights_version=0,
                        finish_reason="stop",
                    )
                )
                step = await env.step(action)
                traj = traj.add_step(step.reward, 0.0)
                observations.append(step.observation)
                if step.done:
                    break
                new = builder.next(traj, step.observation)
        finally:
            await env.close()
        if traj.reward >= 1.0 and observations[0] == f"<result>{task.answer}</result>":
            return traj.finish()
    raise WarmStartError(
        f"no correct demonstration of {task.id} in {tries} tries "
        f"(last observation {observations[0]!r})"
    )


def demonstrations(
    env: str,
    tasks: Sequence[Task],
    builder: PromptBuilder,
    max_turns: int,
    python_share: float,
    seed: int,
    concurrency: int = 4,
) -> list[Trajectory]:
    """Transcripts of ``tasks``; each calls Python with probability ``python_share``."""

    def tool(t: Task) -> str:
        return "py" if random.Random(f"{seed}:{t.id}").random() < python_share else "calc"

    async def all_of() -> list[Trajectory]:
        sem = asyncio.Semaphore(concurrency)  # a few sandboxes at a time: none times out

        async def one(t: Task) -> Trajectory:
            async with sem:
                return await demonstrate(
                    env_name=env, task=t, tool=tool(t), builder=builder, max_turns=max_turns
                )

        return list(await asyncio.gather(*(one(t) for t in tasks)))

    return asyncio.run(all_of())


# -- training ----------------------------------------------------------------------------------


def _pad(trajs: Sequence[Trajectory], pad: int) -> tuple[Any, Any, Any]:
    import torch

    n = max(t.n_tokens for t in trajs)
    ids = torch.full((len(trajs), n), pad, dtype=torch.long)
    attn = torch.zeros((len(trajs), n), dtype=torch.long)
    mask = torch.zeros((len(trajs), n), dtype=torch.bool)
    for i, t in enumerate(trajs):
        k = t.n_tokens
        ids[i, :k] = torch.tensor(t.tokens())
        attn[i, :k] = 1
        mask[i, :k] = torch.tensor(t.loss_mask(), dtype=torch.bool)
    return ids, attn, mask


def reproduced(model: Any, trajs: Sequence[Trajectory], pad: int) -> float:
    """Share of ``trajs`` whose every generated token is the model's greedy choice under teacher
    forcing, except the tool's first letter (the one choice the demonstrations leave open)."""
    import torch

    ids, attn, mask = _pad(trajs, pad)
    was = model.training
    model.eval()
    with torch.no_grad():
        pred = model(input_ids=ids, attention_mask=attn).logits[:, :-1].argmax(-1)
    model.train(was)
    ok = (pred == ids[:, 1:]) | ~mask[:, 1:]
    for i, t in enumerate(trajs):
        ok[i, len(t.turns[0].prompt_ids)] = True  # predicts output token 1: 'c'alc or 'p'y
    return float(ok.all(-1).float().mean())


def train(
    cfg: WarmStartConfig,
    demos: Sequence[Trajectory],
    validation: Sequence[Trajectory],
    progress: Callable[[int, float, float | None], None] | None = None,
) -> tuple[Any, dict]:
    """Cross-entropy on the demonstrations' generated tokens until ``cfg.target`` of the
    validation demonstrations are reproduced (or ``cfg.max_steps``), then ``cfg.cooldown_steps``
    with the learning rate decaying to 0, so that the policy's tool choice settles on the
    demonstrations' mix instead of the last batches'. The model returned is the last of the
    cooldown's checks that reproduced the most (a cooldown can end a demonstration below where
    it passed: seen with transformers 5.25, 0.875 at its end after 0.906 at three checks).
    Returns (model, facts)."""
    import torch
    from transformers import Qwen3ForCausalLM

    from pearl.engines.torch.model import preset_config

    hf = preset_config(cfg.preset)
    hf.initializer_range = cfg.init_std
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model: Any = Qwen3ForCausalLM(hf).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    pad = int(hf.pad_token_id or 0)
    rng = random.Random(f"warm-start:{cfg.seed}")
    checks: list[tuple[int, float]] = []
    loss_v, step = float("nan"), 0
    reached: int | None = None  # the step at which validation first reached the target
    best: tuple[float, int, dict[str, Any]] | None = None  # the cooldown's best check so far
    for step in range(1, cfg.max_steps + cfg.cooldown_steps + 1):
        lr = cfg.lr * min(1.0, step / max(1, cfg.warmup_steps))
        if reached is not None:
            lr = cfg.lr * max(0.0, 1.0 - (step - reached) / max(1, cfg.cooldown_steps))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, attn, mask = _pad(rng.sample(list(demos), min(cfg.batch, len(demos))), pad)
        h = model.model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1]).last_hidden_state
        sel = mask[:, 1:]
        loss = torch.nn.functional.cross_entropy(model.lm_head(h[sel]).float(), ids[:, 1:][sel])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_v = float(loss.detach())
        share = None
        cooled = reached is not None and step - reached >= cfg.cooldown_steps
        if step % cfg.check_every == 0 or (reached is None and step == cfg.max_steps) or cooled:
            share = reproduced(model, validation, pad)
            checks.append((step, share))
        if progress is not None:
            progress(step, loss_v, share)
        if reached is None and share is not None and share >= cfg.target:
            reached = step
        if reached is not None and share is not None and (best is None or share >= best[0]):
            best = (share, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
        if cooled or (reached is None and step >= cfg.max_steps):
            break
    kept = checks[-1] if checks else None
    if best is not None and kept is not None and best[0] > kept[1]:
        model.load_state_dict(best[2])
        kept = (best[1], best[0])
    model.eval()
    return model, {
        "steps": step,
        "loss": loss_v,
        "validation": kept[1] if kept else None,
        "reached_target": bool(kept and kept[1] >= cfg.target),
        "target_at_step": reached,
        "kept_step": kept[0] if kept else None,
        "checks": checks,
    }


# -- the cache ---------------------------------------------------------------------------------


def ensure(
    cfg: WarmStartConfig, cache_dir: str | Path, *, show: bool = True, threads: int = 1
) -> WarmStart:
    """The warm-started model directory for ``cfg``: from ``cache_dir`` when present, else
    generated (demonstrations + training, with a progress bar on stderr) and cached."""
    t0 = time.monotonic()
    path = Path(cache_dir) / cfg.key()
    meta_file = path / "warm_start.json"
    if meta_file.is_file():
        return WarmStart(
            path=path,
            cached=True,
            seconds=time.monotonic() - t0,
            meta=json.loads(meta_file.read_text()),
        )
    import torch

    from pearl.rl.prompt import PromptBuilder
    from pearl.tokenizer import ByteTokenizer

    bar = Progress(cfg.max_steps + cfg.cooldown_steps, show)
    bar.note(
        f"warm start (first run only; cached in {path}): recording {cfg.demos} "
        f"demonstrations in the environment"
    )
    builder = PromptBuilder(ByteTokenizer(), max_len=cfg.max_len)
    held = {
        t.prompt
        for t in held_out_tasks(
            env=cfg.env, n=cfg.held_out, seed=cfg.seed, train_tasks=cfg.train_tasks
        )
    }
    pool = make_tasks(cfg.env, n=4 * (cfg.demos + cfg.validation) + 64, seed=DEMO_SEED + cfg.seed)
    chosen = distinct(
        candidates=pool, n=cfg.demos + cfg.validation, exclude=held, what="demonstration"
    )
    t_demo = time.monotonic()
    demos = demonstrations(
        env=cfg.env,
        tasks=chosen[: cfg.demos],
        builder=builder,
        max_turns=cfg.max_turns,
        python_share=cfg.python_share,
        seed=cfg.seed,
    )
    validation = demonstrations(
        env=cfg.env,
        tasks=chosen[cfg.demos :],
        builder=builder,
        max_turns=cfg.max_turns,
        python_share=0.0,
        seed=cfg.seed,
    )  # the RL environment's tool: the calculator
    demo_s = time.monotonic() - t_demo
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # one: a second thread made a step 5x slower on 2 busy cores
    try:
        t_train = time.monotonic()
        model, facts = train(cfg=cfg, demos=demos, validation=validation, progress=bar.update)
        train_s = time.monotonic() - t_train
    finally:
        torch.set_num_threads(before)
    bar.done(facts)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(str(tmp), safe_serialization=True)
    meta = {
        "key": cfg.key(),
        "config": asdict(cfg),
        **facts,
        "demo_s": demo_s,
        "train_s": train_s,
        "python_demos": sum(t.turns[0].output_ids[1] == ord("p") for t in demos),
    }
    (tmp / "warm_start.json").write_text(json.dumps(meta, indent=1))
    try:
        os.replace(tmp, path)
    except OSError:  # another run cached the same key meanwhile: use that one
        shutil.rmtree(tmp, ignore_errors=True)
    return WarmStart(path=path, cached=False, seconds=time.monotonic() - t0, meta=meta)


class Progress:
    """A one-line progress bar on stderr (a line per check when stderr is not a terminal)."""

    def __init__(self, total: int, show: bool = True) -> None:
        self.total, self.show, self.t0 = total, show, time.monotonic()
        self.tty = sys.stderr.isatty()
        self.share: float | None = None

    def note(self, text: str) -> None:
        if self.show:
            print(text, file=sys.stderr, flush=True)

    def update(self, step: int, loss: float, share: float | None) -> None:
        if share is not None:
            self.share = share
        if not self.show or not (self.tty or share is not None):
            return
        filled = int(30 * step / self.total)
        val = "" if self.share is None else f", validation reproduced {self.share:.0%}"
        line = (
            f"warm start [{'#' * filled}{'.' * (30 - filled)}] step {step}/<={self.total} "
            f"loss {loss:.3f}{val} ({time.monotonic() - self.t0:.0f} s)"
        )
        print(
            ("\r" + line) if self.tty else line,
            end="" if self.tty else "\n",
            file=sys.stderr,
            flush=True,
        )

    def done(self, facts: dict[str, Any]) -> None:
        if self.show:
            end = "\n" if self.tty else ""
            share = facts.get("validation")
            val = "n/a" if share is None else f"{share:.0%}"
            print(
                f"{end}warm start: {facts['steps']} steps, validation reproduced {val} "
                f"({time.monotonic() - self.t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )


__all__ = [
    "WarmStart",
    "WarmStartConfig",
    "WarmStartError",
    "demonstrate",
    "demonstrations",
    "distinct",
    "ensure",
    "held_out_tasks",
    "reproduced",
    "train",
]
