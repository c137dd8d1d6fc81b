"""What makes ``pearl demo`` a learning run: the seed, the cached warm start, held-out evaluation.

:func:`prepare` fixes the run's seed (tasks, sampling, initial weights), brings the warm-started
model directory (trained once per preset, task set and seed, then cached) and points the workers
and the trainer at it; :func:`start_eval` evaluates the starting policy on the held-out set and
returns the background evaluator the training loop feeds every ``eval_every`` steps.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pearl.config import Config, EngineKind
from pearl.core.errors import ConfigError

if TYPE_CHECKING:
    from pearl.rl.heldout import BackgroundEval
    from pearl.rl.warmstart import WarmStartConfig


@dataclass(frozen=True)
class Learning:
    env: str = "tool_use_counts"  # rl.env of the run ("": the config's; --set rl.env=... wins)
    warm_start: bool = True
    eval_every: int = 4  # held-out evaluation every N training steps (0: none), and at the end
    eval_tasks: int = 64
    cache_dir: Path | None = None  # warm starts; default: warm-start/ beside the run directory
    demos: int = 400


@dataclass
class Prepared:
    overrides: tuple[str, ...]
    model_dir: str = ""  # "" = the preset's seeded random weights
    warm_start: dict[str, Any] = field(default_factory=dict)


def seeded(overrides: tuple[str, ...], seed: int | None) -> tuple[str, ...]:
    """``--seed N``: the task set and sampling (``rl.seed``) and the initial weights
    (``engine.torch.seed``); the trace is a fixed segment and needs none."""
    if seed is None:
        return overrides
    return (*overrides, f"rl.seed={seed}", f"engine.torch.seed={seed}")


def warm_start_config(cfg: Config, learning: Learning) -> WarmStartConfig:
    from pearl.rl.warmstart import WarmStartConfig

    return WarmStartConfig(
        env=cfg.rl.env,
        preset=cfg.engine.torch.preset,
        seed=cfg.rl.seed,
        train_tasks=cfg.rl.tasks,
        held_out=learning.eval_tasks,
        max_len=cfg.workload.max_trajectory_tokens,
        max_turns=cfg.rl.max_turns or 4,
        demos=learning.demos,
    )


def prepare(
    config: str | Path,
    overrides: tuple[str, ...],
    out: Path,
    learning: Learning | None,
    quiet: bool = False,
) -> Prepared:
    """The overrides the run starts from: the learning environment and, when ``learning`` asks,
    the warm-started model."""
    from pearl import config as config_mod

    if learning is not None and learning.env:
        overrides = (f"rl.env={learning.env}", *overrides)
    cfg = config_mod.load(config, list(overrides))
    if learning is None or not learning.warm_start:
        model_dir = cfg.engine.torch.preset if "/" in cfg.engine.torch.preset else ""
        return Prepared((*overrides, *for_vllm(cfg, model_dir, out)), model_dir)
    if cfg.engine.kind not in (EngineKind.TORCH, EngineKind.VLLM) or "/" in cfg.engine.torch.preset:
        raise ConfigError(
            f"the warm start trains a preset of the torch engine's models; this config has "
            f"engine.kind = {cfg.engine.kind.value!r}, preset = {cfg.engine.torch.preset!r}. "
            "Pass --no-warm-start"
        )
    if cfg.rl.env != "tool_use_counts":
        raise ConfigError(
            f"the warm start records demonstrations in the tool_use_counts "
            f"environment; rl.env = {cfg.rl.env!r}. Pass --no-warm-start"
        )
    import os

    from transformers.utils import logging as hf_logging

    from pearl.rl.warmstart import ensure

    # Worker hosts (children) and this process load the model directory: no progress bars.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    hf_logging.disable_progress_bar()
    ws = ensure(
        warm_start_config(cfg, learning),
        learning.cache_dir or out.parent / "warm-start",
        show=not quiet,
    )
    info = {
        "path": str(ws.path),
        "cached": ws.cached,
        "seconds": ws.seconds,
        **{
            k: ws.meta.get(k)
            for k in ("steps", "validation", "reached_target", "demo_s", "train_s", "python_demos")
        },
    }
    model = (f"engine.torch.preset={ws.path}", *for_vllm(cfg, str(ws.path), out))
    return Prepared((*overrides, *model), str(ws.path), info)


def for_vllm(cfg: Config, model_dir: str, out: Path) -> tuple[str, ...]:
    """vLLM workers serve what the trainer trains: the model directory (or the preset's seeded
    weights, written as one), with the byte tokenizer beside it. Nothing for other engines, or
    when the config names its own vLLM model."""
    if cfg.engine.kind is not EngineKind.VLLM or cfg.engine.vllm.model_path:
        return ()
    from pearl.engines.vllm.checkpoint import byte_tokenizer, preset_dir

    root = out.parent / "vllm"
    root.mkdir(parents=True, exist_ok=True)
    preset = cfg.engine.torch.preset
    if not model_dir:
        model_dir = str(
            preset_dir(
                preset, cfg.engine.torch.seed, root / f"{preset}-seed{cfg.engine.torch.seed}"
            )
        )
    served = f"engine.vllm.model_path={model_dir}"
    if (Path(model_dir) / "tokenizer.json").is_file():  # its own tokenizer, PEARL's pipeline's too
        return (served,)
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    tok = byte_tokenizer(root / f"byte-tokenizer-{vocab}", vocab)
    return (served, f"engine.vllm.tokenizer={tok}")


def model_kwargs(cfg: Config) -> dict[str, Any]:
    """The GRPOTrainer arguments that build the model the workers serve at version 0."""
    p = cfg.engine.torch.preset
    return {"model_path": p} if "/" in p else {"preset": p, "seed": cfg.engine.torch.seed}


def start_eval(cfg: Config, prepared: Prepared, learning: Learning | None) -> BackgroundEval | None:
    """A started background evaluator with the starting policy (step 0) submitted, or None."""
    if learning is None or learning.eval_every <= 0 or not cfg.rl.env:
        return None
    from pearl.rl.heldout import BackgroundEval, HeldOutEval
    from pearl.rl.warmstart import held_out_tasks

    tasks = held_out_tasks(
        env=cfg.rl.env, n=learning.eval_tasks, seed=cfg.rl.seed, train_tasks=cfg.rl.tasks
    )
    env_kwargs = {"max_turns": cfg.rl.max_turns} if cfg.rl.max_turns else {}
    ev = BackgroundEval(
        HeldOutEval(
            cfg.rl.env,
            tasks,
            model_path=prepared.model_dir,
            preset=cfg.engine.torch.preset,
            seed=cfg.engine.torch.seed,
            max_len=cfg.workload.max_trajectory_tokens,
            max_new_tokens=cfg.rl.max_new_tokens,
            env_kwargs=env_kwargs,
        )
    )
    ev.start()
    ev.submit(0, None, 0)
    return ev


def eval_due(learning: Learning | None, step: int, last: int) -> bool:
    """Evaluate after this step: every ``eval_every`` steps, and after the last one."""
    return bool(
        learning and learning.eval_every > 0 and (step % learning.eval_every == 0 or step == last)
    )


def describe(learning: Learning | None) -> dict[str, Any] | None:
    return (
        None
        if learning is None
        else {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(learning).items()}
    )


__all__ = [
    "Learning",
    "Prepared",
    "describe",
    "eval_due",
    "model_kwargs",
    "prepare",
    "seeded",
    "start_eval",
    "warm_start_config",
]
