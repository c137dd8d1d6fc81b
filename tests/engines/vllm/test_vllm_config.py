"""The vLLM engine's configuration, without a server: the launch command, the colocation-only
rule, and what the worker host's factory builds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pearl import config
from pearl.core.errors import ConfigError
from pearl.core.policy import PD, Policy
from pearl.core.state import Role
from pearl.engines.base import EngineError
from pearl.engines.vllm import launch_command, spec_from_config
from pearl.engines.vllm.engine import check_role
from pearl.engines.vllm.launch import (
    EXTENSION_DIR,
    GENERATED_ARG,
    GRAMMAR_ARG,
    GRAMMAR_PROCESSOR,
    launch_env,
    spread,
)

SETS = ["engine.kind=vllm", "engine.vllm.model_path=/models/qwen3", "daemon.pd=colocated"]


def test_the_launch_command_names_the_model_port_extension_and_kv_cache() -> None:
    cfg = config.load("configs/sim-32.toml", SETS)
    spec = spec_from_config(cfg.engine.vllm, tp=1, first_gpu=3)
    argv = launch_command(spec)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--model"] == "/models/qwen3" and flags["--port"] == str(31000 + 3)
    assert "--worker-extension-cls" in argv and "--enforce-eager" in argv
    assert flags["--logits-processors"] == GRAMMAR_PROCESSOR
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(512 << 20)
    assert "--tokenizer" not in argv
    env = launch_env(spec, {"PYTHONPATH": "/x"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0"  # the processor is a V1-runner one
    assert env["PYTHONPATH"].split(":") == [str(EXTENSION_DIR), "/x"]
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == spread(3)
    assert launch_env(spec, {"VLLM_CPU_OMP_THREADS_BIND": "nobind"})[
        "VLLM_CPU_OMP_THREADS_BIND"
    ] == ("nobind")  # the environment's own choice wins


def test_the_grammar_processor_is_where_the_launch_names_it_with_the_same_arg_names() -> None:
    """The processor runs in vLLM's environment (no PEARL there): its module lies in the
    extension directory, and the extra-arg names PEARL sends are the ones it reads."""
    import ast

    module, cls = GRAMMAR_PROCESSOR.split(":")
    tree = ast.parse((EXTENSION_DIR / f"{module}.py").read_text())
    consts = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    assert (consts["GRAMMAR"], consts["GENERATED"]) == (GRAMMAR_ARG, GENERATED_ARG)
    assert any(isinstance(n, ast.ClassDef) and n.name == cls for n in tree.body)


def test_workers_spread_over_the_cores_and_a_tokenizer_dir_is_passed() -> None:
    cores = sorted(os.sched_getaffinity(0))
    assert [spread(s) for s in range(2 * len(cores))] == [str(c) for c in cores] * 2
    cfg = config.load("configs/sim-32.toml", [*SETS, "engine.vllm.tokenizer=/tok"])
    argv = launch_command(spec_from_config(cfg.engine.vllm, tp=1, first_gpu=0))
    assert argv[argv.index("--tokenizer") + 1] == "/tok"


def test_vllm_pools_are_colocation_only() -> None:
    with pytest.raises(ConfigError, match="serves colocated only"):
        config.load("configs/sim-32.toml", [*SETS, "daemon.pd=disaggregated"])
    adaptive = config.load("configs/sim-32.toml", [*SETS, "daemon.pd=adaptive"])
    assert Policy.of_config(adaptive).pd is PD.COLOCATED
    with pytest.raises(EngineError, match="colocated only"):
        check_role(Role.PREFILL)


def test_a_missing_model_path_is_one_line() -> None:
    cfg = config.load("configs/sim-32.toml", ["engine.kind=vllm", "daemon.pd=colocated"])
    with pytest.raises(ConfigError, match="needs engine.vllm.model_path"):
        spec_from_config(cfg.engine.vllm, tp=1, first_gpu=0)


def test_the_byte_tokenizer_for_vllm_has_the_torch_engines_ids(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from pearl.engines.vllm.checkpoint import byte_tokenizer
    from pearl.tokenizer import ByteTokenizer

    path = byte_tokenizer(tmp_path / "tok", 512)
    hf, ours = AutoTokenizer.from_pretrained(str(path)), ByteTokenizer()
    text = "what is 12 + 30?\n\tü → 42 <tool>"
    assert hf.encode(text, add_special_tokens=False) == ours.encode(text)
    assert hf.decode(ours.encode(text)) == text and len(hf) == 512
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (256, 257, 258)
    assert hf.convert_ids_to_tokens(511) == "<|extra_511|>"
    with pytest.raises(ValueError, match=">= 259 ids"):
        byte_tokenizer(tmp_path / "small", 100)


def test_why_a_server_exited_is_named_on_the_first_line() -> None:
    """The first line is what `pearl status` and pearld's log show of a worker that cannot
    start: a port taken, no model at the path (the last lines of vLLM 0.32's output)."""
    from pearl.engines.process import cause_of

    taken = (
        '  File ".../vllm/entrypoints/launchers/launcher.py", line 348, in create_server_socket\n'
        "    sock.bind(addr)\n"
        "OSError: [Errno 98] Address already in use\n"
    )
    assert cause_of(taken) == "OSError: [Errno 98] Address already in use"
    missing = (
        '    raise OSError(f"{e}") from e\n'
        "(APIServer pid=7) OSError: Repo id must be in the form 'repo_name' or "
        "'namespace/repo_name': '/tmp/nomodel'.\n"
        "\n"
    )
    assert cause_of(missing).startswith("OSError: Repo id must be in the form")
    assert cause_of("INFO starting\nINFO still starting\n") == ""
