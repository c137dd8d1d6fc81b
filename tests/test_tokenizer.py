"""pearl.tokenizer: the byte-level tokenizer, and a model directory's tokenizer.json read without
transformers, giving the ids, text and special tokens AutoTokenizer gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as RustTokenizer

from pearl.core.errors import EngineError
from pearl.engines.vllm.checkpoint import byte_tokenizer
from pearl.tokenizer import ByteTokenizer, HFTokenizer, SlowHFTokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "",
    "hello world",
    "Hello, world! How's it going? I'm fine, aren't you ?",
    "  leading and trailing spaces  ",
    "unicode: héllo wörld — ünïcödé 日本語 🎉",
    "tool(3 + 4) = 7\n\nnext line\ttab",
    "<|im_start|>user\nhi<|im_end|>",
]
CORPUS = [t for t in TEXTS if t] * 20 + ["the quick brown fox jumps over the lazy dog"] * 20


def bpe_dir(out: Path) -> Path:
    """A byte-level BPE with merges and ChatML specials, as Qwen's tokenizers are built."""
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[AddedToken(s, special=True) for s in specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def wordpiece_dir(out: Path) -> Path:
    """A WordPiece (BERT-like) tokenizer that asks for clean-up of spaces, bos and eos given as
    AddedToken dicts in special_tokens_map.json."""
    tok = RustTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]"]
    tok.train_from_iterator(
        CORPUS, trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials)
    )
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    token = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    smap = {"bos_token": {"content": "[CLS]", **token}, "eos_token": {"content": "[SEP]", **token}}
    (out / "special_tokens_map.json").write_text(json.dumps(smap))
    config = {"clean_up_tokenization_spaces": True, "pad_token": "[PAD]", "unk_token": "[UNK]"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("tokenizers")
    return {
        # what the vLLM engine serves for a preset: the byte vocabulary, written by transformers
        "byte-checkpoint": byte_tokenizer(tmp / "byte", 300),
        "bpe": bpe_dir(tmp / "bpe"),
        "wordpiece": wordpiece_dir(tmp / "wordpiece"),
    }


def test_the_byte_tokenizer_round_trips_utf8() -> None:
    t = load_tokenizer(None)
    assert isinstance(t, ByteTokenizer) and isinstance(load_tokenizer("tiny"), ByteTokenizer)
    assert (t.bos_id, t.eos_id, t.pad_id, t.vocab_size) == (256, 257, 258, 259)
    for text in TEXTS:
        assert t.decode(t.encode(text)) == text
        assert t.encode(text, add_bos=True) == [256, *text.encode()]
    assert t.decode([104, 105, 257, 300, -1]) == "hi"  # specials and spare ids are no text


@pytest.mark.parametrize("name", ["byte-checkpoint", "bpe", "wordpiece"])
def test_a_model_dir_gives_what_auto_tokenizer_gives(
    model_dirs: dict[str, Path], name: str
) -> None:
    from transformers import AutoTokenizer

    path = model_dirs[name]
    ours = load_tokenizer(path)
    assert isinstance(ours, HFTokenizer)
    theirs = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    eos = theirs.eos_token_id if theirs.eos_token_id is not None else -1
    bos = theirs.bos_token_id if theirs.bos_token_id is not None else eos
    pad = theirs.pad_token_id if theirs.pad_token_id is not None else eos
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (bos, eos, pad)
    assert ours.eos_id >= 0
    assert ours.vocab_size == len(theirs)
    for text in TEXTS:
        ids = theirs.encode(text, add_special_tokens=False)
        assert ours.encode(text) == ids, text
        assert ours.encode(text, add_bos=True) == [bos, *ids]
        with_eos = [*ids, eos]
        assert ours.decode(with_eos) == theirs.decode(with_eos, skip_special_tokens=True), text
        kept = theirs.decode(with_eos, skip_special_tokens=False)
        assert ours.decode(with_eos, skip_special=False) == kept, text


def test_the_byte_checkpoint_speaks_the_byte_tokenizers_ids(model_dirs: dict[str, Path]) -> None:
    ours, b = load_tokenizer(model_dirs["byte-checkpoint"]), ByteTokenizer()
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (b.bos_id, b.eos_id, b.pad_id)
    for text in TEXTS:
        assert ours.encode(text) == b.encode(text)
        assert ours.decode(b.encode(text)) == text


def test_a_dir_without_tokenizer_json_falls_back_to_transformers(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}")  # and nothing it could load
    with pytest.raises(EngineError, match="no tokenizer could be read"):
        load_tokenizer(tmp_path)
    assert SlowHFTokenizer.__init__.__module__ == "pearl.tokenizer"


def test_a_broken_tokenizer_json_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(EngineError, match=f"no tokenizer could be read from {tmp_path}"):
        load_tokenizer(tmp_path)


def test_loading_a_model_dir_imports_neither_torch_nor_transformers(
    model_dirs: dict[str, Path],
) -> None:
    code = (
        "import sys; from pearl.tokenizer import load_tokenizer; "
        f"t = load_tokenizer({str(model_dirs['bpe'])!r}); t.decode(t.encode('hi there')); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.stdout.strip() == "[]", run.stderr


def test_the_byte_tokenizer_writes_special_ids_out_only_when_asked() -> None:
    b = ByteTokenizer()
    ids = [b.bos_id, *b.encode("hé"), b.eos_id, 300]
    assert b.decode(ids) == "hé"
    assert b.decode(ids, skip_special=False) == "<|bos|>hé<|eos|><|spare_300|>"
