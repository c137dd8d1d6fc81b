"""Launching one vLLM server per worker: the command line and its environment.

:func:`launch_command` is pure: it turns a :class:`VLLMSpec` (the ``[engine]`` settings and the
worker's port) into ``PYTHON -m vllm.entrypoints.openai.api_server ...``. The server runs from
the Python the config names (``engine.vllm.python``), so vLLM may live in an environment of its
own; :func:`launch_env` adds what PEARL needs of it: the development endpoints (pause, resume,
sleep, weight updates, ``collective_rpc``), PEARL's worker extension and grammar processor on
its import path, and vLLM's V1 model runner (the interface the grammar processor implements).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pearl.config import VllmConfig
from pearl.core.errors import ConfigError
from pearl.engines.base import EngineError

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
SERVED_NAME = "pearl"  # the model name requests use, whatever the checkpoint's path
# PEARL's worker extension: a module of its own directory, importable without pearl installed.
EXTENSION_DIR = Path(__file__).resolve().parent / "ext"
EXTENSION_CLS = "pearl_vllm_worker.PearlWeights"
# PEARL's grammar: a logits processor of the same directory (structured outputs that resume
# from a kept prefix), and the per-request extra args it reads; their names equal the module's.
GRAMMAR_PROCESSOR = "pearl_vllm_grammar:PearlGrammar"
GRAMMAR_ARG = "pearl_grammar"
GENERATED_ARG = "pearl_generated"
# The environment `make test` creates for vLLM (vLLM pins its own transformers and numpy).
DEFAULT_VENV = Path(__file__).resolve().parents[3] / ".venv-vllm"


@dataclass(frozen=True)
class VLLMSpec:
    """Everything the launch command of one worker's vLLM server depends on."""

    model_path: str
    tokenizer: str = ""  # --tokenizer: a directory other than the model's
    tp: int = 1
    host: str = "127.0.0.1"
    port: int = 31000
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    enforce_eager: bool = True  # no graph capture: seconds, not minutes, to start on CPUs
    chunked_prefill: bool = False  # see VllmConfig.chunked_prefill
    sleep_mode: bool = False  # --enable-sleep-mode (CUDA): a lend frees the device memory
    # KV cache size. 0: vLLM's default, a fraction of the device's memory, which on CPUs is 92%
    # of the machine's: a second server (or the next after a crash) could not start.
    kv_cache_mb: int = 512
    python: str = ""  # "": the environment `make test` creates, else this interpreter
    extra_args: tuple[str, ...] = ()
    # CPUs: the cores the server's OpenMP threads are bound to (VLLM_CPU_OMP_THREADS_BIND).
    # vLLM's own choice binds every server on a machine to the same core.
    cpu_cores: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def default_python() -> str:
    """``.venv-vllm/bin/python`` when `make test` made it, else this interpreter."""
    venv = DEFAULT_VENV / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def launch_command(spec: VLLMSpec) -> list[str]:
    if not spec.model_path:
        raise EngineError("a vLLM server needs a model directory (engine.vllm.model_path)")
    if spec.tp < 1:
        raise EngineError(f"tp must be >= 1, got {spec.tp}")
    argv = [
        spec.python or default_python(),
        "-m",
        VLLM_MODULE,
        "--model",
        spec.model_path,
        "--served-model-name",
        SERVED_NAME,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--tensor-parallel-size",
        str(spec.tp),
        "--dtype",
        spec.dtype,
        "--max-model-len",
        str(spec.max_model_len),
        "--worker-extension-cls",
        EXTENSION_CLS,
        "--logits-processors",
        GRAMMAR_PROCESSOR,
        "--enable-prompt-tokens-details",  # cached prompt tokens in the usage
        "--enable-prefix-caching",  # a trajectory's next turn reuses its prefix
    ]
    if spec.tokenizer:
        argv += ["--tokenizer", spec.tokenizer]
    if spec.kv_cache_mb > 0:
        argv += ["--kv-cache-memory-bytes", str(spec.kv_cache_mb << 20)]
    if spec.enforce_eager:
        argv.append("--enforce-eager")
    argv.append(
        "--enable-chunked-prefill" if spec.chunked_prefill else "--no-enable-chunked-prefill"
    )
    if spec.sleep_mode:
        argv.append("--enable-sleep-mode")
    return argv + list(spec.extra_args)


def launch_env(spec: VLLMSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: development endpoints on, PEARL's extension and grammar
    processor importable, vLLM's V1 model runner (the V2 runner refuses a V1 logits processor),
    its threads on its own cores unless the environment already says where."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    if spec.cpu_cores:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", spec.cpu_cores)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(EXTENSION_DIR) + (os.pathsep + path if path else "")
    return env


def spec_from_config(cfg: VllmConfig, tp: int, first_gpu: int) -> VLLMSpec:
    """The VLLMSpec of one worker from the ``[engine.vllm]`` table. Ports are
    per worker, the base plus the worker's first GPU id, as for SGLang."""
    if not cfg.model_path:
        raise ConfigError(
            "engine.kind = 'vllm' needs engine.vllm.model_path: the Hugging Face model "
            "directory the vLLM servers load"
        )
    return VLLMSpec(
        model_path=cfg.model_path,
        tokenizer=cfg.tokenizer,
        tp=tp,
        host=cfg.host,
        port=cfg.port + first_gpu,
        dtype=cfg.dtype,
        max_model_len=cfg.max_model_len,
        enforce_eager=cfg.enforce_eager,
        chunked_prefill=cfg.chunked_prefill,
        sleep_mode=cfg.sleep_mode,
        kv_cache_mb=cfg.kv_cache_mb,
        python=cfg.python,
        extra_args=tuple(shlex.split(cfg.extra_args)),
        cpu_cores=spread(first_gpu),
    )


PROBE = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"


def preflight(cfg: VllmConfig, local: bool = True) -> None:
    """Refuse, with one ConfigError line, an ``[engine.vllm]`` table whose vLLM servers
    cannot start anywhere: no model path; and, when the servers run on this machine
    (``local``), a model path that is not a model directory, or an interpreter that is missing
    or cannot import vllm. pearld runs it before it binds anything."""
    spec_from_config(cfg, 1, 0)  # no model path
    if not local:
        return
    model = Path(cfg.model_path)
    if not (model / "config.json").is_file():
        raise ConfigError(
            f"engine.vllm.model_path = {str(model)!r} is not a model directory (no "
            "config.json there); give the Hugging Face model directory the servers load"
        )
    python = cfg.python or default_python()
    try:
        probe = subprocess.run(
            [python, "-c", PROBE], capture_output=True, timeout=60, check=False
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(
            f"engine.vllm.python = {python!r} cannot be run ({type(e).__name__}: {e}); give "
            "an interpreter with vLLM installed (`make test` creates .venv-vllm)"
        ) from None
    if probe.returncode != 0:
        where = "engine.vllm.python" if cfg.python else "the default interpreter"
        raise ConfigError(
            f"{where} {python!r} cannot import vllm; install vLLM there or set "
            f"engine.vllm.python (`make test` creates {DEFAULT_VENV})"
        )


def spread(slot: int) -> str:
    """The core of a worker's slot: slots take this process's cores in turn."""
    cores = sorted(os.sched_getaffinity(0))
    return str(cores[slot % len(cores)])


__all__ = [
    "DEFAULT_VENV",
    "EXTENSION_CLS",
    "EXTENSION_DIR",
    "GENERATED_ARG",
    "GRAMMAR_ARG",
    "GRAMMAR_PROCESSOR",
    "SERVED_NAME",
    "VLLM_MODULE",
    "VLLMSpec",
    "default_python",
    "launch_command",
    "launch_env",
    "preflight",
    "spec_from_config",
    "spread",
]
