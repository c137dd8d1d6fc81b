"""Embed PEARL in your own training loop (in process, or against a running pearld).

python examples/custom_training_loop.py [--steps 5] [--endpoint tcp://127.0.0.1:7440] [--model DIR]
"""

import argparse
import statistics
from pathlib import Path

import pearl
from pearl.rl.grpo import GRPOTrainer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--endpoint", help="a running pearld (default: PEARL in this process)")
    ap.add_argument("--model", help="the Qwen3 directory the workers serve (engine.torch.preset)")
    args = ap.parse_args()
    if args.endpoint:
        rt = pearl.connect(args.endpoint)
    else:
        config = Path(__file__).resolve().parents[1] / "configs" / "local-cpu.toml"
        rt = pearl.Runtime.from_config(config).start()
    model = {"model_path": args.model} if args.model else {"preset": "tiny"}
    trainer = GRPOTrainer(**model, seed=0, lr=3e-4, device="cpu")
    first = rt.status().training_step + 1
    try:
        for step in range(first, first + args.steps):
            batch = rt.next_batch(timeout_s=300)  # B trajectories, staleness-bounded
            rewards = [t.reward for t in batch]
            with rt.training(step):  # returns once borrowed workers are back
                metrics = trainer.step(batch)
                rt.publish_weights(trainer.state_dict(), step)
            print(
                f"step {step}: reward {statistics.mean(rewards):.3f}, loss "
                f"{metrics['loss']:+.4f}, {len(batch)} trajectories, borrowed GPUs back in "
                f"{rt.last_return_s * 1e3:.0f} ms, mode {rt.status().mode}"
            )
    finally:
        rt.stop()


if __name__ == "__main__":
    main()
