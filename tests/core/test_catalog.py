"""Catalog priors: published architecture numbers, datasheet specs, roofline sanity."""

from __future__ import annotations

import pytest

from pearl.core import catalog
from pearl.core.catalog import gpu_spec, model_spec, roofline
from pearl.core.errors import ConfigError, InfeasibleConfiguration

# Non-embedding / total parameter counts from the Qwen3 model cards.
PUBLISHED = {  # name: (non-embedding params, total params)
    "qwen3-0.6b": (0.44e9, 0.6e9),
    "qwen3-8b": (6.95e9, 8.2e9),
    "qwen3-30b-a3b": (29.9e9, 30.5e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_model_cards(name: str) -> None:
    m = model_spec(name)
    non_embedding, total = PUBLISHED[name]
    assert m.layers * m.layer_params() == pytest.approx(non_embedding, rel=0.02)
    assert m.total_params == pytest.approx(total, rel=0.02)


def test_moe_active_parameters_are_about_3b() -> None:
    m = model_spec("qwen3-30b-a3b")
    # 3.3B activated per the model card, counting the input embedding too.
    assert m.active_params + m.embedding_params == pytest.approx(3.3e9, rel=0.03)


@pytest.mark.parametrize(
    ("name", "K"),
    [
        ("qwen3-8b", 2 * 36 * 8 * 128 * 2),
        ("qwen3-30b-a3b", 2 * 48 * 4 * 128 * 2),
        ("qwen3-0.6b", 2 * 28 * 8 * 128 * 2),
        ("qwen3-tiny", 2 * 2 * 2 * 16 * 2),
    ],
)
def test_kv_bytes_per_token(name: str, K: int) -> None:
    assert model_spec(name).K == K


def test_tiny_model_is_what_a_cpu_engine_runs() -> None:
    m = model_spec("qwen3-tiny")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.vocab) == (2, 64, 4, 2, 16, 512)


def test_datasheet_numbers() -> None:
    h100, h800, h200, a100 = (gpu_spec(n) for n in ("H100", "H800", "H200", "A100"))
    assert h100.flops == pytest.approx(989.4e12)  # dense BF16
    assert (h800.flops, h800.hbm_Bps, h800.hbm_bytes) == (h100.flops, h100.hbm_Bps, h100.hbm_bytes)
    assert h800.intra_node_Bps == pytest.approx(200e9)  # 400 GB/s NVLink, both directions
    assert h800.hbm_bytes == pytest.approx(80e9)
    assert h200.hbm_bytes == pytest.approx(141e9) and h200.hbm_Bps == pytest.approx(4.8e12)
    assert a100.flops == pytest.approx(312e12) and a100.hbm_Bps == pytest.approx(2.039e12)


def test_lookups_are_case_insensitive_and_errors_suggest() -> None:
    assert gpu_spec("h800").name == "H800"
    assert model_spec("Qwen3-8B").name == "qwen3-8b"
    with pytest.raises(ConfigError, match="did you mean 'H800'"):
        gpu_spec("H8000")
    with pytest.raises(ConfigError, match="qwen3-8b"):
        model_spec("qwen3-8")


def _roof(model: str = "qwen3-8b", gpu: str = "H800", tp: int = 2, **kw: float) -> catalog.Roofline:
    kw.setdefault("context", 16_000)
    kw.setdefault("seq_tokens", 32_000)
    return roofline(model, gpu, tp, **kw)


def test_qwen3_8b_on_h800_tp2_is_in_the_expected_ranges() -> None:
    r = _roof()
    assert 1e-3 < r.A < 10e-3  # weight streaming: milliseconds per decode iteration
    assert 1e-5 < r.b < r.A  # one sequence's KV read costs less than the weights
    assert 5e-6 < r.t_prefill < 1e-4  # tens of microseconds per prefill token
    assert r.K_seq == r.K * 32_000


def test_roofline_against_hand_computation() -> None:
    r = _roof(context=0, seq_tokens=1000)
    h, inter, layers = 4096, 12288, 36
    layer = 2 * h * 32 * 128 + 2 * h * 8 * 128 + 2 * h + 2 * 128 + 3 * h * inter
    lm_head = 151936 * h
    # t_prefill at context 0: 2 FLOPs per non-embedding parameter over 2 GPUs at 45% MFU.
    assert r.t_prefill == pytest.approx(2 * layers * layer / (2 * 989.4e12 * 0.45))
    # A: all weights plus the LM head streamed at 80% of 2 x 3.35 TB/s, plus the launch floor.
    floor = layers * 15e-6 + 2 * layers * 8e-6
    fixed_cost = r.A
    assert fixed_cost == pytest.approx((layers * layer + lm_head) * 2 / (2 * 3.35e12 * 0.8) + floor)
    total = layers * layer + 2 * lm_head + h
    assert r.H_max == pytest.approx(2 * 80e9 * 0.9 - 2 * total)
    bandwidth = r.BW
    assert bandwidth == pytest.approx(2 * 50e9 * 0.8)


def test_faster_hardware_and_more_tp_are_faster() -> None:
    h100, a100, h200 = _roof(gpu="H100"), _roof(gpu="A100"), _roof(gpu="H200")
    assert a100.A > h100.A and a100.t_prefill > h100.t_prefill and a100.b > h100.b
    assert h200.A < h100.A and h200.H_max > h100.H_max
    tp1, tp4 = _roof(tp=1), _roof(tp=4)
    assert tp4.A < h100.A < tp1.A
    assert tp4.t_prefill < h100.t_prefill < tp1.t_prefill
    assert tp4.H_max > h100.H_max > tp1.H_max


def test_longer_context_costs_more_per_sequence() -> None:
    assert _roof(context=30_000).b > _roof(context=1_000).b
    assert _roof(context=30_000).t_prefill > _roof(context=1_000).t_prefill


def test_moe_weight_reads_grow_with_batch_up_to_all_experts() -> None:
    m = model_spec("qwen3-30b-a3b")
    one, some, many = m.weights_read(1), m.weights_read(16), m.weights_read(4096)
    assert one == pytest.approx((m.active_params) * 2)  # batch 1 reads the active experts only
    assert one < some < many <= (m.total_params - m.embedding_params) * 2 + 1
    assert many == pytest.approx((m.total_params - m.embedding_params - m.hidden) * 2, rel=1e-3)
    dense = model_spec("qwen3-8b")
    assert dense.weights_read(1) == dense.weights_read(64)


def test_a_model_that_does_not_fit_is_an_error() -> None:
    with pytest.raises(InfeasibleConfiguration, match="do not fit"):
        _roof(model="qwen3-30b-a3b", gpu="A100", tp=1, mem_fraction=0.5)


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        _roof(tp=0)
    with pytest.raises(ConfigError):
        _roof(mem_fraction=1.5)
