"""Write a small Qwen3 model directory, as ``save_pretrained`` writes one, with a tokenizer.

    python examples/make_checkpoint.py /tmp/my-qwen3

Stands in for a checkpoint you bring (this machine may have no network to download one): seeded
random weights of the ``tiny`` preset, and a Hugging Face byte-level tokenizer beside them.
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from pearl.engines.vllm.checkpoint import byte_tokenizer, preset_dir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path, help="the directory to write (kept when it exists)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = preset_dir(args.preset, args.seed, args.out)
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    with tempfile.TemporaryDirectory() as tmp:  # the tokenizer's files go beside the weights
        for f in byte_tokenizer(Path(tmp) / "tokenizer", vocab).iterdir():
            shutil.copy(f, out / f.name)
    print(f"wrote {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")


if __name__ == "__main__":
    main()
