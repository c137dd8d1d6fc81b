"""What only the torch engine has: the real model, its weights, tokenizer, presets and sampling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen3ForCausalLM

from pearl.engines.base import EngineError, GenerateRequest, SamplingParams
from pearl.engines.torch import PRESETS, TorchEngine
from pearl.engines.torch import model as M
from pearl.tokenizer import ByteTokenizer, load_tokenizer

from .helpers import prompt_of, run


@pytest.fixture
def engine() -> TorchEngine:
    e = TorchEngine(preset="tiny", token_budget=16)  # small budget: prompts go in chunks
    e.start()
    yield e  # type: ignore[misc]
    e.stop()


def hf_greedy(
    model: Qwen3ForCausalLM, prompt: tuple[int, ...], n: int
) -> tuple[list[int], list[float]]:
    ids, lps = list(prompt), []
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            tok = int(logits.argmax())
            lps.append(float(torch.log_softmax(logits, -1)[tok]))
            ids.append(tok)
    return ids[len(prompt) :], lps


def test_paged_chunked_forward_matches_the_hugging_face_model(engine: TorchEngine) -> None:
    prompt = prompt_of(50)
    r = run(engine, prompt, max_new_tokens=12)
    tokens, lps = hf_greedy(engine.model, prompt, 12)
    assert list(r.output_ids) == tokens
    assert r.logprobs == pytest.approx(lps, abs=1e-4)


def test_weights_load_from_safetensors_and_torch_files(engine: TorchEngine, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    other = M.build(
        config=M.preset_config("tiny"),
        source=M.WeightSource("seed", 7),
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    state = {k: v.clone() for k, v in other.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "w.safetensors"))
    torch.save(state, tmp_path / "w.pt")
    want, _ = hf_greedy(other, prompt_of(20), 8)
    engine.load_weights(1, str(tmp_path / "w.safetensors"))
    assert list(run(engine, prompt_of(20), max_new_tokens=8).output_ids) == want
    engine.load_weights(2, tmp_path / "w.pt")
    r = run(engine, prompt_of(20), rid="pt", max_new_tokens=8)
    assert list(r.output_ids) == want and r.weights_version == 2
    with pytest.raises(EngineError, match="does not exist"):
        engine.load_weights(3, str(tmp_path / "missing.pt"))
    with pytest.raises(EngineError, match="do not"):
        engine.load_weights(3, {"model.embed_tokens.weight": torch.zeros(3, 3)})
    with pytest.raises(EngineError, match="unexpected"):
        engine.load_weights(3, {**state, "bogus": torch.zeros(1)})
    assert engine.weights_version == 2


def test_a_local_model_directory_loads(tmp_path: Path) -> None:
    model = M.build(
        config=M.preset_config("tiny"),
        source=M.WeightSource("seed", 3),
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    model.save_pretrained(tmp_path)
    want, _ = hf_greedy(model, prompt_of(10), 5)
    e = TorchEngine(model_path=str(tmp_path))
    e.start()
    try:
        assert list(run(e, prompt_of(10), max_new_tokens=5).output_ids) == want
        assert isinstance(e.tokenizer, ByteTokenizer)  # no tokenizer files there
        e.release_memory()
        e.resume_memory()
        assert list(run(e, prompt_of(10), rid="again", max_new_tokens=5).output_ids) == want
    finally:
        e.stop()


def test_a_checkpoint_of_another_architecture_is_refused_in_one_line(tmp_path: Path) -> None:
    """A Llama directory used to load into a Qwen3 with fresh norms and serve garbage."""
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"],
    ).save_pretrained(tmp_path)  # fmt: skip
    with pytest.raises(EngineError) as err:
        TorchEngine(model_path=str(tmp_path))
    msg = str(err.value)
    assert "a llama checkpoint (LlamaForCausalLM)" in msg and "Qwen3 only" in msg
    assert "\n" not in msg


def test_release_frees_the_weights_and_a_cpu_copy_can_be_kept() -> None:
    for keep in (False, True):
        e = TorchEngine(preset="tiny", keep_cpu_copy=keep)
        e.start()
        e.load_weights(
            1,
            M.build(
                config=M.preset_config("tiny"),
                source=M.WeightSource("seed", 9),
                device=torch.device("cpu"),
                dtype=torch.float32,
            ).state_dict(),
        )
        before = run(e, prompt_of(12), max_new_tokens=6).output_ids
        e.release_memory()
        assert e.model is None and e.runner is None and e.kv_usage()["pages"] == 0
        e.resume_memory()
        assert run(e, prompt_of(12), rid="b", max_new_tokens=6).output_ids == before
        e.stop()


def test_a_worker_resuming_from_a_published_snapshot_serves_those_weights(tmp_path: Path) -> None:
    """The weight store saves tied tensors once (no lm_head.weight). A worker that rebuilds its
    model from such a file (resume after lending its GPUs) must tie lm_head again and recompute
    the rotary buffers, not serve uninitialised memory."""
    from pearl.rl.weights import WeightStore

    cfg = M.preset_config("tiny")
    trained = M.build(
        config=cfg,
        source=M.WeightSource("seed", 11),
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    path = WeightStore(tmp_path / "store").publish(1, trained.state_dict())
    rebuilt = M.build(
        config=cfg,
        source=M.WeightSource("file", str(path)),
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    assert rebuilt.lm_head.weight is rebuilt.model.embed_tokens.weight
    x = torch.tensor([list(prompt_of(16))])
    with torch.inference_mode():
        assert torch.equal(rebuilt(x).logits, trained(x).logits)
    want, _ = hf_greedy(trained, prompt_of(12), 6)
    e = TorchEngine(preset="tiny")
    e.start()
    try:
        e.load_weights(1, str(path))
        assert list(run(e, prompt_of(12), max_new_tokens=6).output_ids) == want
        e.release_memory()
        e.resume_memory()  # rebuilds from the file
        assert list(run(e, prompt_of(12), rid="after", max_new_tokens=6).output_ids) == want
    finally:
        e.stop()


def test_a_released_worker_resumes_on_its_pending_version_when_its_own_was_pruned(
    tmp_path: Path,
) -> None:
    """Lent, then given a newer version while released: resume builds from the newer snapshot,
    never from the one loaded before the release (the weight store keeps only the newest few)."""
    from pearl.rl.weights import WeightStore

    cfg = M.preset_config("tiny")
    store = WeightStore(tmp_path / "store", keep=1)
    v1 = store.publish(
        1,
        M.build(
            config=cfg,
            source=M.WeightSource("seed", 11),
            device=torch.device("cpu"),
            dtype=torch.float32,
        ).state_dict(),
    )
    newer = M.build(
        config=cfg,
        source=M.WeightSource("seed", 12),
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    want, _ = hf_greedy(newer, prompt_of(12), 6)
    e = TorchEngine(preset="tiny")
    e.start()
    try:
        e.load_weights(1, str(v1))
        e.release_memory()
        v2 = store.publish(2, newer.state_dict())
        assert not v1.exists()  # pruned
        e.load_weights(2, str(v2))  # applied at resume
        e.resume_memory()
        assert e.weights_version == 2
        assert list(run(e, prompt_of(12), rid="after", max_new_tokens=6).output_ids) == want
    finally:
        e.stop()


def test_top_p_near_zero_is_greedy_and_sampling_varies(engine: TorchEngine) -> None:
    greedy = run(engine, prompt_of(9), max_new_tokens=10).output_ids
    nucleus = run(engine, prompt_of(9), rid="p", max_new_tokens=10, temperature=1.0, top_p=1e-6)
    assert nucleus.output_ids == greedy
    hot = {
        run(engine, prompt_of(9), rid=f"h{i}", max_new_tokens=10, temperature=1.5).output_ids
        for i in range(3)
    }
    assert len(hot) > 1  # unseeded sampling draws fresh entropy


def test_presets_span_tiny_to_qwen3_0_6b() -> None:
    def params(name: str) -> int:
        with torch.device("meta"):
            m = Qwen3ForCausalLM(M.preset_config(name))
        return sum(p.numel() for p in m.parameters())

    assert params("tiny") < 1_000_000
    assert params("tiny") < params("small") < 10_000_000
    assert 550e6 < params("qwen3-0.6b") < 650e6
    assert set(PRESETS) >= {"tiny", "small", "qwen3-0.6b"}
    assert M.kv_bytes_per_token(M.preset_config("qwen3-0.6b"), torch.bfloat16) == 114_688


def test_bad_configuration_is_refused_clearly() -> None:
    with pytest.raises(EngineError, match="presets"):
        TorchEngine(preset="huge")
    with pytest.raises(EngineError, match="unknown TorchEngine option"):
        TorchEngine(presets="tiny")
    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match="CUDA is not available"):
            TorchEngine(device="cuda")
    with pytest.raises(EngineError, match="not running"):
        TorchEngine().generate(GenerateRequest(rid="x", input_ids=(1,), sampling=SamplingParams()))


def test_byte_tokenizer_round_trips_text() -> None:
    tok = load_tokenizer(None)
    ids = tok.encode("héllo, world", add_bos=True)
    assert ids[0] == tok.bos_id and all(0 <= i < 256 for i in ids[1:])
    assert tok.decode(ids) == "héllo, world"
    assert max(tok.bos_id, tok.eos_id, tok.pad_id) < PRESETS["tiny"]["vocab_size"]
