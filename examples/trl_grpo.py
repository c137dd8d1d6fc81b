"""TRL's GRPOTrainer, unmodified, learning through PEARL's elastic pool (pearl.integrations.trl).

The demo's counting task with the calculator tool (``tool_use_counts``), PEARL in this process on
``configs/local-cpu.toml`` (torch workers; the trainer's two slots lent between TRL's steps), a
Bamboo segment moving the preemptible workers, TRL's own logging.

    python examples/trl_grpo.py [--steps 16] [--model DIR] [--async-steps K] --json FILE

Without ``--model``, the tiny Qwen3 is warm-started on demonstrations first, as ``pearl demo``
does (cached under runs/warm-start; a first run trains it for about two minutes). ``--model`` is
any Hugging Face causal LM directory the torch workers can serve; without a tokenizer.json there,
the byte-level tokenizer is written beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENV, TASKS, HELD_OUT, MAX_TURNS = "tool_use_counts", 256, 64, 4


def model_dir(args: argparse.Namespace) -> tuple[Path, Path]:
    """The model the workers serve and TRL trains, and the directory of its tokenizer."""
    from pearl.engines.vllm.checkpoint import byte_tokenizer

    if args.model:
        path = Path(args.model)
    else:
        from pearl.rl.warmstart import WarmStartConfig, ensure

        cfg = WarmStartConfig(env=ENV, seed=args.seed, train_tasks=TASKS, held_out=HELD_OUT)
        path = ensure(cfg, ROOT / "runs" / "warm-start").path
    if (path / "tokenizer.json").is_file():
        return path, path
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    return path, byte_tokenizer(ROOT / "runs" / "warm-start" / f"byte-tokenizer-{vocab}", vocab)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--model", help="a Hugging Face causal LM directory (default: warm-started)")
    ap.add_argument("--async-steps", type=int, default=0, help="rollouts started K steps ahead")
    ap.add_argument("--json", required=True, help="where to write the run's figures")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--segment", default="S2", help="the Bamboo segment the preemptibles follow")
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import pearl
    from pearl.demo.app import Timeline
    from pearl.demo.job import TraceDriver
    from pearl.integrations.trl import PearlRollout
    from pearl.rl.heldout import HeldOutEval
    from pearl.rl.warmstart import held_out_tasks
    from pearl.rl.weights import cpu_state

    torch.set_num_threads(1)
    model, tok = model_dir(args)
    out = Path(args.json).resolve().parent / f"trl-grpo-{time.strftime('%Y%m%d-%H%M%S')}"
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / "local-cpu.toml",
        state_dir=out / "state",
        overrides=(
            "rl.env=",  # TRL's prompts are the rollout traffic
            "gateway.listen=127.0.0.1:0",
            f"engine.torch.preset={model}",
            f"engine.torch.seed={args.seed}",
        ),
    ).start()
    timeline = Timeline(t0=time.monotonic())
    trace = TraceDriver(rt, args.segment, seconds=6.0 * args.steps, timeline=timeline)
    heldout = HeldOutEval(
        ENV,
        held_out_tasks(ENV, n=HELD_OUT, seed=args.seed, train_tasks=TASKS),
        model_path=str(model),
        env_kwargs={"max_turns": MAX_TURNS},
    )
    rollout = PearlRollout(
        rt, env=ENV, max_turns=MAX_TURNS, async_steps=args.async_steps, seed=args.seed
    )
    ends: list[float] = []

    class StepClock(TrainerCallback):  # wall time of each TRL step, rollout included
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            ends.append(time.monotonic())

        def on_step_end(self, *a: Any, **k: Any) -> None:
            ends.append(time.monotonic())

    try:
        first = heldout.evaluate(None, 0)["accuracy"]
        print(f"held-out accuracy at step 0: {first:.2f}", flush=True)
        policy = AutoModelForCausalLM.from_pretrained(str(model))
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=rollout.reward,
            args=GRPOConfig(
                output_dir=str(out / "trl"),
                per_device_train_batch_size=16,
                num_generations=4,
                max_steps=args.steps,
                learning_rate=args.lr,
                lr_scheduler_type="constant",
                beta=0.0,
                temperature=1.0,
                logging_steps=1,
                report_to=[],
                use_cpu=True,
                save_strategy="no",
                disable_tqdm=True,
                seed=args.seed,
            ),
            train_dataset=rollout.dataset(TASKS, seed=args.seed),
            processing_class=AutoTokenizer.from_pretrained(str(tok)),
            rollout_func=rollout,
            callbacks=[rollout.callback, StepClock()],
        )
        trace.start()
        trainer.train()
        trace.halt.set()
        last = heldout.evaluate(cpu_state(policy), args.steps)["accuracy"]
    finally:
        trace.halt.set()
        rollout.close()
        heldout.close()
        rt.stop()

    rewards = [h["rewards/reward/mean"] for h in trainer.state.log_history if "step" in h and
               "rewards/reward/mean" in h]  # fmt: skip
    q = max(1, len(rewards) // 4)
    step_s = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    figures = {
        "steps": len(rewards),
        "async_steps": args.async_steps,
        "heldout_first": first,
        "heldout_last": last,
        "heldout_gain": last - first,
        "reward_first_quarter": statistics.mean(rewards[:q]),
        "reward_last_quarter": statistics.mean(rewards[-q:]),
        "rewards": rewards,
        "lost_trajectories": rollout.failed,
        "resampled_stale": sum(r.resampled for r in rollout.records),
        "migrations": rollout.migrations,
        "step_s": step_s,
        "step_s_median": statistics.median(step_s),
        "return_s_max": max(r.return_s for r in rollout.records),
        "lent_windows": sum(r.lent > 0 for r in rollout.records),
        "lent_served_s": sum(r.served_s or 0.0 for r in rollout.records),
        "preemptible_events": [what for _, what in timeline.events],
    }
    Path(args.json).write_text(json.dumps(figures, indent=1))
    print(json.dumps({k: v for k, v in figures.items() if not isinstance(v, list)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
