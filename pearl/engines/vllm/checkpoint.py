"""What a vLLM server loads when PEARL's own models serve on it: a model directory and a tokenizer.

vLLM loads any local Hugging Face directory. PEARL's presets are Qwen3s that speak the torch
engine's byte-level tokenizer (ids 0-255 are UTF-8 bytes, then bos, eos, pad), which has no
files: :func:`byte_tokenizer` writes the same vocabulary as a Hugging Face tokenizer, so a vLLM
server sees the ids PEARL's pipeline does. Ids past the three specials, up to the model's
vocabulary, are placeholders (``<|extra_N|>``): an untrained model samples them, and a vLLM
server that could not name them would fail the request.

The tokenizer goes in a directory of its own (``engine.vllm.tokenizer``): in the model's, it
would make PEARL's pipeline read the model's prompts with it instead of its byte tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from pearl.tokenizer import ByteTokenizer

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"


def _byte_chars() -> dict[int, str]:
    """The printable character byte-level BPE uses for each byte (GPT-2's table)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer(out: str | Path, vocab_size: int) -> Path:
    """Write, into ``out``, a Hugging Face tokenizer whose ids are ByteTokenizer's, padded with
    placeholders to ``vocab_size``. Written once: an existing one is kept."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = Path(out)
    if (out / "tokenizer.json").is_file():
        return out
    b = ByteTokenizer
    if vocab_size < b.vocab_size:
        raise ValueError(f"a byte-level model needs >= {b.vocab_size} ids, not {vocab_size}")
    vocab = {c: i for i, c in _byte_chars().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = [BOS, EOS, PAD] + [f"<|extra_{i}|>" for i in range(b.vocab_size, vocab_size)]
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD
    )
    ids = (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id)
    if ids != (b.bos_id, b.eos_id, b.pad_id) or len(fast) != vocab_size:
        raise AssertionError(f"byte tokenizer specials at {ids}, {len(fast)} ids")
    tmp = out.with_name(f".{out.name}.tmp")
    fast.save_pretrained(str(tmp))
    tmp.replace(out)
    return out


def preset_dir(preset: str, seed: int, out: str | Path) -> Path:
    """A torch-engine preset's seeded weights as a model directory (what the torch engine
    serves at version 0 for this preset and seed), written once."""
    import torch

    from pearl.engines.torch.model import WeightSource, build, preset_config

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    model = build(
        config=preset_config(preset), source=WeightSource("seed", seed),
        device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip
    tmp = out.with_name(f".{out.name}.tmp")
    model.save_pretrained(str(tmp), safe_serialization=True)
    tmp.replace(out)
    return out


__all__ = ["byte_tokenizer", "preset_dir"]
