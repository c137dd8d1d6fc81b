"""The vLLM engine's configuration, without a server: the launch command, the colocation-only
rule, and what the worker host's factory builds."""

from __future__ import annotations

import pytest

from pearl import config
from pearl.core.errors import ConfigError
from pearl.core.policy import PD, Policy
from pearl.core.state import Role
from pearl.engines.base import EngineError
from pearl.engines.vllm import launch_command, spec_from_config
from pearl.engines.vllm.engine import check_role
from pearl.engines.vllm.launch import EXTENSION_DIR, launch_env

SETS = ["engine.kind=vllm", "engine.vllm_model_path=/models/qwen3", "daemon.pd=colocated"]


def test_the_launch_command_names_the_model_port_extension_and_kv_cache() -> None:
    cfg = config.load("configs/sim-32.toml", SETS)
    spec = spec_from_config(cfg.engine, tp=1, first_gpu=3)
    argv = launch_command(spec)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--model"] == "/models/qwen3" and flags["--port"] == str(31000 + 3)
    assert "--worker-extension-cls" in argv and "--enforce-eager" in argv
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(512 << 20)
    env = launch_env({"PYTHONPATH": "/x"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["PYTHONPATH"].split(":") == [str(EXTENSION_DIR), "/x"]


def test_vllm_pools_are_colocation_only() -> None:
    with pytest.raises(ConfigError, match="serves colocated only"):
        config.load("configs/sim-32.toml", [*SETS, "daemon.pd=disaggregated"])
    adaptive = config.load("configs/sim-32.toml", [*SETS, "daemon.pd=adaptive"])
    assert Policy.of_config(adaptive).pd is PD.COLOCATED
    with pytest.raises(EngineError, match="colocated only"):
        check_role(Role.PREFILL)


def test_a_missing_model_path_is_one_line() -> None:
    cfg = config.load("configs/sim-32.toml", ["engine.kind=vllm", "daemon.pd=colocated"])
    with pytest.raises(ConfigError, match="needs engine.vllm_model_path"):
        spec_from_config(cfg.engine, tp=1, first_gpu=0)
