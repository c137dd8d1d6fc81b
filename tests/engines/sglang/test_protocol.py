"""SGLang's payloads, checked against literal JSON of its documented shapes."""

from __future__ import annotations

import pytest

from pearl.core.state import Role
from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams
from pearl.engines.server_metrics import MetricsDelta
from pearl.engines.sglang import protocol as P
from pearl.engines.sglang.engine import METRICS


def test_generate_body_is_sglangs() -> None:
    req = GenerateRequest(
        rid="t3-turn1",
        input_ids=(5, 6, 7),
        sampling=SamplingParams(
            max_new_tokens=9, temperature=0.7, top_p=0.9, stop_ids=(2,), seed=11
        ),
    )
    body = P.generate_body(req, P.Bootstrap("10.0.0.5", 8998, 12345))
    assert body == {
        "rid": "t3-turn1$",
        "input_ids": [5, 6, 7],
        "sampling_params": {
            "max_new_tokens": 9,
            "temperature": 0.7,
            "top_p": 0.9,
            "stop_token_ids": [2],
            "sampling_seed": 11,
        },
        "return_logprob": True,
        "stream": False,
        "bootstrap_host": "10.0.0.5",
        "bootstrap_port": 8998,
        "bootstrap_room": 12345,
    }
    back, boot = P.request_of(body)
    assert back.input_ids == req.input_ids and back.sampling == req.sampling
    assert boot == P.Bootstrap("10.0.0.5", 8998, 12345)


def test_wire_rids_defeat_prefix_matching_aborts() -> None:
    assert not P.wire_rid("r10").startswith(P.wire_rid("r1"))
    assert P.plain_rid(P.wire_rid("r1")) == "r1"


def test_an_aborted_answer_keeps_its_prefix() -> None:
    answer = {
        "text": "",
        "output_ids": [4, 8, 15],
        "meta_info": {
            "id": "x$",
            "finish_reason": {"type": "abort", "message": "Abort"},
            "prompt_tokens": 6,
            "completion_tokens": 3,
            "cached_tokens": 2,
            "weight_version": "7",
            "output_token_logprobs": [[-0.1, 4, None], [-0.2, 8, None], [-0.3, 15, None]],
        },
    }
    r = P.result_of(rid="x", body=answer, role=Role.COLOCATED, version=0)
    assert r.finish_reason is FinishReason.ABORT and r.output_ids == (4, 8, 15)
    assert r.logprobs == (-0.1, -0.2, -0.3) and r.weights_version == 7
    assert (r.prompt_tokens, r.cached_tokens) == (6, 2)


@pytest.mark.parametrize(
    "kind,role,want",
    [
        ("stop", Role.COLOCATED, FinishReason.STOP),
        ("length", Role.DECODE, FinishReason.LENGTH),
        ("length", Role.PREFILL, FinishReason.PREFILLED),
        ("abort", Role.PREFILL, FinishReason.ABORT),
    ],
)
def test_finish_reasons(kind: str, role: Role, want: FinishReason) -> None:
    answer = {
        "output_ids": [1],
        "meta_info": {"finish_reason": {"type": kind}, "weight_version": "default"},
    }
    r = P.result_of(rid="r", body=answer, role=role, version=3)
    assert r.finish_reason is want and r.weights_version == 3  # non-numeric: the engine's own


def test_versions() -> None:
    assert P.parse_version("0.5.21rc1") == (0, 5, 21) and P.parse_version("0.6") == (0, 6, 0)
    assert not P.supports_role_switch("0.5.20") and P.supports_role_switch("0.5.21")
    assert P.supports_role_switch("1.0.0")
    assert P.Endpoints.legacy().server_info == "/get_server_info"


def test_rooms_are_63_bit() -> None:
    rooms = {P.new_room() for _ in range(200)}
    assert len(rooms) == 200 and all(0 <= r < 2**63 for r in rooms)


def test_metrics_are_summed_over_labels() -> None:
    text = (
        "# HELP sglang:num_running_reqs x\n# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="a",dp="0"} 3\n'
        'sglang:num_running_reqs{model_name="a",dp="1"} 2\n'
        "sglang:prompt_tokens_total 1e3\n"
    )
    assert P.parse_metrics(text) == {
        "sglang:num_running_reqs": 5.0,
        "sglang:prompt_tokens_total": 1000.0,
    }
    assert P.parse_metrics(P.render_metrics({"a:b": 1.5}, 'x="y"')) == {"a:b": 1.5}


def test_metric_deltas_become_iteration_stats() -> None:
    m = MetricsDelta(METRICS)
    m.reset(
        {
            "sglang:inter_token_latency_seconds_sum": 1.0,
            "sglang:inter_token_latency_seconds_count": 10,
        }
    )
    t = m.update(
        {
            "sglang:inter_token_latency_seconds_sum": 1.5,
            "sglang:inter_token_latency_seconds_count": 20,
            "sglang:num_running_reqs": 4,
            "sglang:time_to_first_token_seconds_sum": 0.4,
            "sglang:time_to_first_token_seconds_count": 2,
            "sglang:prompt_tokens_total": 600,
        },
        Role.COLOCATED,
    )
    decode, prefill = t.iterations
    assert (decode.duration_s, decode.decode_batch) == (pytest.approx(0.05), 4)
    assert (prefill.duration_s, prefill.prefill_tokens) == (pytest.approx(0.2), 300)
    assert m.update({}, Role.COLOCATED).iterations == ()
