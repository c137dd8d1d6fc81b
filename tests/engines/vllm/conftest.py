"""A real vLLM server for the vLLM engine's tests, serving a tiny random Qwen3 written here.

vLLM runs from the environment `make test` creates (``.venv-vllm``: vLLM pins its own
transformers); where that environment is missing the tests skip and say how to make it. The
model is written at test time, with no network: a byte-level BPE tokenizer trained on a few
lines, a ChatML chat template, and a Qwen3 of head size 32 (vLLM's CPU attention takes 32, 64,
80, ... and refuses the torch engine's ``tiny`` preset, head size 16).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pearl.engines.vllm.launch import DEFAULT_VENV, default_python

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def vllm_python() -> str:
    python = default_python()
    if not (DEFAULT_VENV / "bin" / "python").exists():
        pytest.skip(f"no vLLM environment at {DEFAULT_VENV}: `make test` creates it")
    return python


def write_tiny_qwen3(out: Path, seed: int = 0) -> Path:
    """A random Qwen3 checkpoint with its tokenizer and chat template in ``out``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["what is 12 + 30? the answer is 42.\n"] * 50, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    cfg = Qwen3Config(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(cfg).save_pretrained(out)  # float32: what the test server serves
    return out


def write_tiny_llama(out: Path, tokenizer_from: Path, seed: int = 3) -> Path:
    """A random Llama checkpoint in ``out``, with the tokenizer files of ``tokenizer_from``:
    another architecture than the Qwen3, which vLLM serves as well."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=512, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(out)
    for f in tokenizer_from.glob("tokenizer*"):
        shutil.copy(f, out)
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session")
def tiny_llama(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), tiny_model)


@pytest.fixture(scope="package")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One started VLLMEngine shared by the modules that use it (a server takes about a minute
    to start on two busy cores). Tests that kill its server wait for the relaunch, so the next
    module finds it serving; it stops after the last test that uses it (see below)."""
    from pearl.engines.process import ServerProcess
    from pearl.engines.vllm import VLLMEngine, VLLMEngineConfig, VLLMSpec

    spec = VLLMSpec(
        str(tiny_model),
        port=free_port(),
        dtype="float32",
        max_model_len=512,
        python=vllm_python(),
    )
    log = tmp_path_factory.mktemp("vllm-log") / "server.log"
    eng = VLLMEngine(VLLMEngineConfig(spec, log_path=str(log), startup_timeout_s=600))
    eng.start()
    try:
        yield eng
    finally:
        eng.stop()
        assert eng.server is None or not eng.server.alive()
        assert isinstance(eng.server, ServerProcess | None)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared engine after its last user, not at the end of the package: an idle server
    would hold memory and threads while the cluster tests start servers of their own."""
    if "engine" not in getattr(item, "fixturenames", ()):
        return
    items = item.session.items
    later = items[items.index(item) + 1 :] if item in items else []
    if any("engine" in getattr(i, "fixturenames", ()) for i in later):
        return
    eng = getattr(item, "funcargs", {}).get("engine")
    if eng is not None:
        eng.stop()  # idempotent: the fixture's own stop then only checks it


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
