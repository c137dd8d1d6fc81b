"""Launch commands for every role and option, checked against SGLang's flags (no process runs)."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from pearl.config import EngineConfig, SGLangConfig, from_mapping
from pearl.core.errors import ConfigError
from pearl.core.state import Role
from pearl.engines import facade
from pearl.engines.base import EngineError
from pearl.engines.sglang import launch as L

BASE = L.ServerSpec(
    model_path="/models/qwen3-8b", tp=2, port=30004, bootstrap_port=9002, python="python"
)


def argv(**kw: object) -> list[str]:
    return L.launch_command(dataclasses.replace(BASE, **kw))  # type: ignore[arg-type]


def test_colocated_command_is_exactly_sglangs() -> None:
    assert argv() == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/qwen3-8b",
        "--tp",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        "30004",
        "--disaggregation-mode",
        "null",
        "--enable-memory-saver",
        "--enable-metrics",
    ]


def test_prefill_names_backend_and_bootstrap_port() -> None:
    a = argv(role=Role.PREFILL, transfer_backend="nixl")
    assert a[a.index("--disaggregation-mode") + 1] == "prefill"
    assert a[a.index("--disaggregation-transfer-backend") + 1] == "nixl"
    assert a[a.index("--disaggregation-bootstrap-port") + 1] == "9002"
    assert "--enable-pd-role-switch" not in a


def test_decode_has_no_bootstrap_port_unless_it_may_become_prefill() -> None:
    a = argv(role=Role.DECODE)
    assert a[a.index("--disaggregation-mode") + 1] == "decode"
    assert a[a.index("--disaggregation-transfer-backend") + 1] == "mooncake"
    assert "--disaggregation-bootstrap-port" not in a
    b = argv(role=Role.DECODE, role_switch=True)
    assert b[b.index("--disaggregation-bootstrap-port") + 1] == "9002"
    assert "--enable-pd-role-switch" in b


def test_role_switch_flag_only_in_pd_mode() -> None:
    assert "--enable-pd-role-switch" not in argv(role_switch=True)
    assert "--enable-pd-role-switch" in argv(role=Role.PREFILL, role_switch=True)


def test_memory_options_and_extra_args() -> None:
    a = argv(
        weights_cpu_backup=True,
        memory_saver=False,
        metrics=False,
        extra_args=("--mem-fraction-static", "0.8"),
    )
    assert "--enable-weights-cpu-backup" in a and "--enable-memory-saver" not in a
    assert "--enable-metrics" not in a and a[-2:] == ["--mem-fraction-static", "0.8"]
    assert L.split_args("--a 1 --b 'x y'") == ("--a", "1", "--b", "x y")


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"role": Role.TRAINING}, "serves as one of"),
        ({"model_path": ""}, "model path"),
        ({"transfer_backend": "carrier-pigeon"}, "transfer backend"),
        ({"tp": 0}, "tp must"),
    ],
)
def test_bad_specs_are_refused(kw: dict[str, object], match: str) -> None:
    with pytest.raises(EngineError, match=match):
        argv(**kw)


def test_spec_from_config_offsets_ports_by_the_first_gpu() -> None:
    cfg = SGLangConfig(
        model_path="/m",
        port=31000,
        bootstrap_port=9100,
        role_switch="on",
        extra_args="--chunked-prefill-size 4096",
    )
    s = L.spec_from_config(cfg, tp=4, first_gpu=8)
    assert (s.port, s.bootstrap_port, s.tp, s.role_switch) == (31008, 9108, 4, True)
    assert s.extra_args == ("--chunked-prefill-size", "4096")
    with pytest.raises(ConfigError, match=r"engine\.sglang\.model_path"):
        L.spec_from_config(SGLangConfig(), tp=1, first_gpu=0)


def test_role_switch_auto_follows_the_installed_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(L, "installed_sglang", lambda: "0.5.20")
    assert not L.role_switch_wanted("auto", L.SGLANG_MODULE)
    monkeypatch.setattr(L, "installed_sglang", lambda: "0.5.21")
    assert L.role_switch_wanted("auto", L.SGLANG_MODULE)
    monkeypatch.setattr(L, "installed_sglang", lambda: None)
    assert not L.role_switch_wanted("auto", L.SGLANG_MODULE)
    assert L.role_switch_wanted("auto", L.FACADE_MODULE)  # the facade decides by its version
    assert not L.role_switch_wanted("off", L.FACADE_MODULE)


def test_first_gpu_comes_from_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    assert L.first_gpu() == 6
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert L.first_gpu() == 0


def test_config_validates_router_and_role_switch() -> None:
    with pytest.raises(ConfigError, match="did you mean 'sglang-router'"):
        from_mapping({"engine": {"router": "sglang_router"}})
    with pytest.raises(ConfigError, match=r"engine\.sglang\.role_switch = 'maybe'"):
        from_mapping({"engine": {"sglang": {"role_switch": "maybe"}}})
    with pytest.raises(ConfigError, match="engine.sglang_role_switch moved to engine.sglang.role"):
        from_mapping({"engine": {"sglang_role_switch": "on"}})


def test_the_facade_understands_every_flag_the_engine_passes() -> None:
    for role in (Role.COLOCATED, Role.PREFILL, Role.DECODE):
        a = argv(role=role, role_switch=True, weights_cpu_backup=True)
        ns = facade.parse_args(a[3:])
        assert ns.disaggregation_mode == {"colocated": "null"}.get(role.value, role.value)
        assert ns.enable_memory_saver and ns.enable_metrics and ns.port == 30004


def test_sglang_is_never_imported() -> None:
    assert "sglang" not in sys.modules


def test_the_factory_builds_an_sglang_engine_without_starting_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pearl.engines.factory import build_engine
    from pearl.engines.sglang import SGLangEngine
    from transports.bulk import ZmqKVChannel

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    cfg = EngineConfig(kind="sglang", sglang=SGLangConfig(model_path="/m", module=L.FACADE_MODULE))
    kv = ZmqKVChannel()
    try:
        e = build_engine(cfg, model="qwen3-8b", gpu="H100", tp=1, role=Role.DECODE, kv_channel=kv)
        assert isinstance(e, SGLangEngine) and e.role is Role.DECODE
        assert (e.spec.port, e.spec.bootstrap_port, e.spec.role_switch) == (30003, 9001, True)
        assert e.client.base == "http://127.0.0.1:30003"
        with pytest.raises(EngineError, match="kv_channel"):
            build_engine(cfg, model="m", gpu="H100", tp=1, role=Role.PREFILL, kv_channel=None)
    finally:
        kv.close()
