"""PEARL's torch engine on one device: decode iteration time against the decode batch.

Eq. 1-3 price a decode iteration as A + b n (n sequences decoding). On a GPU a step streams the
weights once whatever n is (A) and each sequence adds its KV reads (b), so b n stays small next to
A until n is large; on a CPU slot each sequence costs about half of A (docs/pd.md). This measures
both on the engine PEARL runs, with n sequences of the same short prompt decoding together, and
fits A and b by least squares over the iterations in which all n decoded.

    python scripts/gpu-decode.py --device cuda --preset qwen3-0.6b [--batches 1 2 4 ...] [--json F]

Random weights of the preset (nothing is downloaded). Prints one line per batch size and the fit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from pearl.engines.base import GenerateRequest, SamplingParams  # noqa: E402
from pearl.engines.torch.engine import TorchEngine  # noqa: E402


def run(n: int, args: argparse.Namespace) -> tuple[float, float, int]:
    """Median iteration time with all n sequences decoding, its spread, and the iterations."""
    eng = TorchEngine(
        preset=args.preset,
        device=args.device,
        threads=args.threads,
        kv_budget_bytes=args.kv_mib << 20,
        max_running=max(n, 1),
        token_budget=max(n * args.prompt, 256),
    )
    eng.start()
    try:
        prompt = tuple(range(1, args.prompt + 1))
        sampling = SamplingParams(max_new_tokens=args.gen, temperature=0.0)
        warm = [
            eng.generate(GenerateRequest(rid=f"w{i}", input_ids=prompt, sampling=sampling))
            for i in range(n)
        ]
        for f in warm:
            f.result(timeout=600)
        eng.telemetry()  # drop the warm-up's iterations
        futures = [
            eng.generate(GenerateRequest(rid=f"r{i}", input_ids=prompt, sampling=sampling))
            for i in range(n)
        ]
        for f in futures:
            f.result(timeout=600)
        its = [
            s.duration_s
            for s in eng.telemetry().iterations
            if s.decode_batch == n and s.prefill_tokens == 0
        ]
    finally:
        eng.stop()
    if not its:
        raise SystemExit(f"batch {n}: no iteration decoded all {n} sequences at once")
    q = np.percentile(its, [25, 75])
    return statistics.median(its), float(q[1] - q[0]), len(its)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per sequence")
    ap.add_argument("--gen", type=int, default=64, help="tokens each sequence generates")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kv-mib", type=int, default=4096)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    t0 = time.monotonic()
    rows = []
    for n in args.batches:
        med, iqr, k = run(n, args)
        rows.append({"batch": n, "median_s": med, "iqr_s": iqr, "iterations": k})
        print(
            f"batch {n:4d}: {1e3 * med:8.3f} ms an iteration (IQR {1e3 * iqr:.3f} ms, {k} its)",
            flush=True,
        )
    n = np.array([r["batch"] for r in rows], dtype=float)
    t = np.array([r["median_s"] for r in rows])
    b, A = np.polyfit(n, t, 1)
    fit = {"A_s": float(A), "b_s": float(b), "b_over_A": float(b / A) if A else None}
    print(
        f"fit over the medians: A = {1e3 * A:.3f} ms, b = {1e6 * b:.2f} us a sequence "
        f"(b / A = {b / A:.4f}: one more sequence costs {100 * b / A:.2f}% of an iteration); "
        f"{args.device}, preset {args.preset}, {time.monotonic() - t0:.0f} s"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"device": args.device, "preset": args.preset, "rows": rows, "fit": fit}, indent=1
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
