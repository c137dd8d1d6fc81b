"""What only the sim engine promises: its telemetry is its cost model, at its time scale."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pearl.core.state import Role
from pearl.engines.base import EngineError, GenerateRequest, SamplingParams
from pearl.engines.sim import SimCost, SimEngine
from transports.bulk import LocalKVHub

from .helpers import prompt_of

COST = SimCost(
    A=0.02,
    b=0.001,
    t_prefill=1e-4,
    kv_bytes_per_token=1000,
    kv_bandwidth=1e6,
    start_s=1.0,
    activation_s=2.0,
    release_s=1.0,
    load_s=3.0,
)


def engine(scale: float = 0.01, **kw: object) -> SimEngine:
    e = SimEngine(cost=COST, time_scale=scale, **kw)  # type: ignore[arg-type]
    e.start()
    return e


def test_a_tracker_fits_back_the_cost_model() -> None:
    e = engine(0.001)
    futs = [
        e.generate(
            GenerateRequest(
                rid=f"r{i}",
                input_ids=prompt_of(10 + 7 * i),
                sampling=SamplingParams(max_new_tokens=5 + 3 * i),
            )
        )
        for i in range(12)
    ]
    [f.result(30) for f in futs]
    e.stop()
    its = e.telemetry().iterations
    x = np.array([[1, it.decode_batch, it.prefill_tokens] for it in its], dtype=float)
    y = np.array([it.duration_s for it in its])
    A, b, t_prefill = np.linalg.lstsq(x, y, rcond=None)[0]
    assert (A, b, t_prefill) == pytest.approx((COST.A, COST.b, COST.t_prefill), rel=1e-6)


def test_generation_and_memory_operations_take_scaled_model_time() -> None:
    e = engine(0.01)
    t0 = time.monotonic()
    e.generate(
        GenerateRequest(
            rid="r", input_ids=prompt_of(100), sampling=SamplingParams(max_new_tokens=50)
        )
    ).result(30)
    took = time.monotonic() - t0
    model_s = COST.iteration_s(0, 100) + 49 * COST.iteration_s(1, 0)  # 1.05 s of model time
    assert 0.9 * model_s * 0.01 < took < 0.5 + 3 * model_s * 0.01  # slack: a shared 2-core VM
    for op, cost in (
        (e.release_memory, COST.release_s),
        (e.resume_memory, COST.activation_s),
        (lambda: e.load_weights(1, None), COST.load_s),
    ):
        t0 = time.monotonic()
        op()
        assert 0.9 * cost * 0.01 < time.monotonic() - t0 < 0.5 + cost * 0.01
    e.stop()


def test_kv_transfers_carry_meta_only_and_report_modelled_bytes() -> None:
    hub = LocalKVHub()
    p = engine(kv_channel=hub.channel("p"), role=Role.PREFILL)
    d = engine(kv_channel=hub.channel("d"), role=Role.DECODE)
    sp = SamplingParams(max_new_tokens=4)
    fut = d.generate(
        GenerateRequest(rid="r", input_ids=prompt_of(40), sampling=sp, transfer_id="t")
    )
    p.generate(
        GenerateRequest(
            rid="r", input_ids=prompt_of(40), sampling=sp, transfer_id="t", kv_peer="local://d"
        )
    )
    assert len(fut.result(10).output_ids) == 4
    (sent,), (got,) = p.telemetry().transfers, d.telemetry().transfers
    assert sent.bytes == got.bytes == 40 * COST.kv_bytes_per_token
    assert got.duration_s == pytest.approx(COST.transfer_s(40))
    p.stop()
    d.stop()


def test_unknown_options_are_refused() -> None:
    with pytest.raises(EngineError, match="time_scael"):
        SimEngine(time_scael=0.1)


def test_cost_comes_from_the_catalog_roofline() -> None:
    from pearl.core.catalog import roofline

    roof = roofline("qwen3-8b", "H800", 2, context=8000, seq_tokens=16000)
    cost = SimCost.from_roofline(roof, start_s=5.0)
    assert (cost.A, cost.b, cost.t_prefill, cost.kv_bandwidth) == (
        roof.A,
        roof.b,
        roof.t_prefill,
        roof.BW,
    )
    assert cost.kv_bytes_per_token == roof.K and cost.start_s == 5.0
