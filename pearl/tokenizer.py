"""Tokenizers without torch: a byte-level one that needs no files, or a model directory's own.

Everything that turns text into ids (the gateway, pearld's pipeline, the prompt builder, the vLLM
checkpoint writer, the torch engine) loads its tokenizer here. A model directory's
``tokenizer.json`` is read by the ``tokenizers`` library alone (the Rust tokenizer that
``transformers``' fast tokenizers wrap), with the special tokens its ``tokenizer_config.json``
names: the same ids and text as ``AutoTokenizer`` gives, without importing torch or
``transformers`` (seconds of a process's start). Only a directory with no ``tokenizer.json`` (a
slow, sentencepiece or vocab-and-merges tokenizer) falls back to ``transformers``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from pearl.core.errors import EngineError


class Tokenizer(Protocol):
    """Text to ids and back: what the gateway, the prompt builder and the engines tokenize with."""

    bos_id: int
    eos_id: int
    pad_id: int
    vocab_size: int

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """The text of ``ids``; special tokens (bos, eos, a chat template's markers) are left
        out unless ``skip_special`` is false."""
        ...


class ByteTokenizer:
    """Ids 0-255 are UTF-8 bytes; then bos, eos, pad. Ids beyond are models' spare vocabulary."""

    bos_id, eos_id, pad_id = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        if skip_special:
            return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
        out, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            out += [run.decode("utf-8", errors="replace"), self.special_text(i)]
            run = bytearray()
        return "".join([*out, run.decode("utf-8", errors="replace")])

    def special_text(self, i: int) -> str:
        """The text of a special or spare id: ``<|bos|>``, ``<|eos|>``, ``<|pad|>``,
        ``<|spare_N|>`` (the names llguidance's view of this vocabulary gives them)."""
        named = {self.bos_id: "<|bos|>", self.eos_id: "<|eos|>", self.pad_id: "<|pad|>"}
        return named.get(i, f"<|spare_{i}|>")


def _token_text(entry: object) -> str | None:
    """A special token as ``tokenizer_config.json`` gives it: a string or an AddedToken dict."""
    if isinstance(entry, dict):
        entry = entry.get("content")
    return entry if isinstance(entry, str) else None


def _clean_up(text: str) -> str:
    """``transformers``' ``clean_up_tokenization``: no space before punctuation and contractions."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'")):
        text = text.replace(a, b)
    for a, b in ((" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


class HFTokenizer:
    """A local Hugging Face tokenizer's ``tokenizer.json`` (never downloads), read by the
    ``tokenizers`` library; bos, eos and pad are those ``tokenizer_config.json`` (or
    ``special_tokens_map.json``) names, as ``AutoTokenizer`` reads them."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        p = Path(path)
        try:
            self._tok = RustTokenizer.from_file(str(p / "tokenizer.json"))
            config = self._config(p)
        except Exception as e:  # a missing, unreadable or malformed file: one line
            raise EngineError(f"no tokenizer could be read from {p}: {e}") from None
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        eos = self._special(config, "eos_token")
        self.eos_id = eos if eos is not None else -1
        bos = self._special(config, "bos_token")
        self.bos_id = bos if bos is not None else self.eos_id
        pad = self._special(config, "pad_token")
        self.pad_id = pad if pad is not None else self.eos_id
        # transformers 5 cleans up only where asked, and never a BPE's text (it would corrupt it).
        self._clean = bool(config.get("clean_up_tokenization_spaces", False)) and (
            type(self._tok.model).__name__ != "BPE"
        )

    @staticmethod
    def _config(p: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins
            f = p / name
            if f.is_file():
                data = json.loads(f.read_text(encoding="utf-8"))
                if not isinstance(data, dict):
                    raise ValueError(f"{name} holds {type(data).__name__}, not an object")
                out.update({k: v for k, v in data.items() if v is not None})
        return out

    def _special(self, config: dict[str, Any], key: str) -> int | None:
        text = _token_text(config.get(key))
        return None if text is None else self._tok.token_to_id(text)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        text = str(self._tok.decode(list(ids), skip_special_tokens=skip_special))
        return _clean_up(text) if self._clean else text


class SlowHFTokenizer:
    """A local Hugging Face tokenizer with no ``tokenizer.json`` (sentencepiece, vocab and
    merges), through ``transformers``' ``AutoTokenizer``: the one case that imports it."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        try:
            self._tok: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as e:
            raise EngineError(f"no tokenizer could be read from {path}: {e}") from None
        t = self._tok
        self.eos_id = t.eos_token_id if t.eos_token_id is not None else -1
        self.bos_id = t.bos_token_id if t.bos_token_id is not None else self.eos_id
        self.pad_id = t.pad_token_id if t.pad_token_id is not None else self.eos_id
        self.vocab_size = len(t)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False)
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special))


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """The tokenizer in model directory ``path`` if it has one, else the byte-level tokenizer."""
    if path:
        p = Path(path)
        if (p / "tokenizer.json").exists():
            return HFTokenizer(p)
        if (p / "tokenizer_config.json").exists():
            return SlowHFTokenizer(p)
    return ByteTokenizer()


__all__ = [
    "ByteTokenizer",
    "HFTokenizer",
    "SlowHFTokenizer",
    "Tokenizer",
    "load_tokenizer",
]
