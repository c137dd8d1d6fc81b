"""Tokenizers for the torch engine: a byte-level one that needs no download, or a local HF one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pearl.engines.base import EngineError


class Tokenizer(Protocol):
    bos_id: int
    eos_id: int
    pad_id: int
    vocab_size: int

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: list[int] | tuple[int, ...]) -> str: ...


class ByteTokenizer:
    """Ids 0-255 are UTF-8 bytes; then bos, eos, pad. Ids beyond are models' spare vocabulary."""

    bos_id, eos_id, pad_id = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A tokenizer from a local Hugging Face directory (never downloads)."""

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

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """The HF tokenizer in ``path`` if it has one, else the byte-level tokenizer."""
    if path:
        p = Path(path)
        if any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            return HFTokenizer(p)
    return ByteTokenizer()


__all__ = ["ByteTokenizer", "HFTokenizer", "Tokenizer", "load_tokenizer"]
