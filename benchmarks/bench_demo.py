"""The demo job with PEARL's adaptive control vs a fixed colocated configuration, same trace.

Both run ``pearl demo``'s job (tiny Qwen3 workers on the torch engine, the tool-use environment,
real GRPO steps) on configs/local-cpu.toml with the same Bamboo segment squeezed into the same
wall time. PEARL decides the PD mode and ratio and borrows the training slots through the gate;
the baseline keeps every worker colocated and never borrows (what an elastic but PD-unaware
system does). Runs alternate (PEARL, baseline, PEARL, ...) so machine noise hits both alike.
Also reports the time from Training Begin to the last borrowed worker being back.

    .venv/bin/python benchmarks/bench_demo.py [--steps 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pearl import demo  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "local-cpu.toml"
POLICIES = {
    "pearl": (),
    "fixed colocated": ("daemon.pd=colocated", "daemon.borrow=never"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--segment", default="S2")
    args = ap.parse_args()
    trace_s = 4.0 * args.steps
    results: dict[str, list[dict]] = {name: [] for name in POLICIES}
    with tempfile.TemporaryDirectory(prefix="bench_demo-") as tmp:
        for r in range(args.rounds):
            for name, overrides in POLICIES.items():
                out = Path(tmp) / f"{name.replace(' ', '-')}-{r}"
                s = demo.run(CONFIG, args.steps, out, segment=args.segment, trace_s=trace_s,
                             overrides=overrides, quiet=True)
                results[name].append(s)
                print(f"round {r + 1} {name:<16} {s['throughput_tok_s']:8.0f} tok/s over "
                      f"{s['elapsed_s']:5.1f} s; return after Training Begin mean "
                      f"{1e3 * s['mean_return_s']:.0f} ms, max {1e3 * s['max_return_s']:.0f} ms",
                      flush=True)
    print()
    tput = {n: statistics.mean(x["throughput_tok_s"] for x in v) for n, v in results.items()}
    print(f"{'policy':<16} {'tokens/s':>9} {'vs fixed':>9} {'return mean':>12} {'return max':>11}")
    for name, v in results.items():
        mean_ret = statistics.mean(x["mean_return_s"] for x in v)
        max_ret = max(x["max_return_s"] for x in v)
        print(f"{name:<16} {tput[name]:>9.0f} {tput[name] / tput['fixed colocated']:>8.2f}x "
              f"{1e3 * mean_ret:>10.0f}ms {1e3 * max_ret:>9.0f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
