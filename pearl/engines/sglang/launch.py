"""Launching one SGLang server per worker: the command line, from the worker's role and config.

:func:`launch_command` is pure: it turns a :class:`ServerSpec` (the worker's role plus the
``[engine]`` settings) into ``python -m sglang.launch_server ...`` with the flags of the role;
:class:`~pearl.engines.process.ServerProcess` runs it.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, replace
from importlib import metadata

from pearl.config import RoleSwitch, SGLangConfig
from pearl.core.errors import ConfigError
from pearl.core.state import Role
from pearl.engines.base import EngineError
from pearl.engines.process import ServerProcess, first_gpu
from pearl.engines.sglang.protocol import MODES, supports_role_switch

SGLANG_MODULE = "sglang.launch_server"
FACADE_MODULE = "pearl.engines.facade"  # the torch (or sim) engine speaking SGLang's dialect
TRANSFER_BACKENDS = ("mooncake", "nixl", "mori", "ascend", "fake")


@dataclass(frozen=True)
class ServerSpec:
    """Everything the launch command of one worker's server depends on."""

    model_path: str
    role: Role = Role.COLOCATED
    tp: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    bootstrap_port: int = 8998  # prefill side: where decode servers fetch KV (SGLang's default)
    transfer_backend: str = "mooncake"
    memory_saver: bool = True  # needed by /release_memory_occupation (borrowing)
    weights_cpu_backup: bool = False  # release keeps a CPU copy: resume needs no disk reload
    role_switch: bool = False  # --enable-pd-role-switch (SGLang 0.5.21+)
    metrics: bool = True  # /metrics, the telemetry source
    module: str = SGLANG_MODULE
    python: str = sys.executable
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def with_role(self, role: Role) -> ServerSpec:
        return replace(self, role=role)


def launch_command(spec: ServerSpec) -> list[str]:
    """The argv of the server for ``spec.role``.

    Every role runs ``--disaggregation-mode null|prefill|decode``; PD roles name the transfer
    backend; the bootstrap port is the prefill side's (also given to a decode server that may
    switch to prefill in place); ``--enable-pd-role-switch`` only where it can apply (PD roles).
    """
    if spec.role not in MODES:
        raise EngineError(
            f"an SGLang server serves as one of {[r.value for r in MODES]}, not {spec.role}"
        )
    if spec.tp < 1:
        raise EngineError(f"tp must be >= 1, got {spec.tp}")
    if not spec.model_path:
        raise EngineError("an SGLang server needs a model path (engine.sglang.model_path)")
    if spec.transfer_backend not in TRANSFER_BACKENDS:
        raise EngineError(
            f"transfer backend {spec.transfer_backend!r} is not one of "
            f"{', '.join(TRANSFER_BACKENDS)}"
        )
    argv = [
        spec.python,
        "-m",
        spec.module,
        "--model-path",
        spec.model_path,
        "--tp",
        str(spec.tp),
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--disaggregation-mode",
        MODES[spec.role],
    ]
    pd = spec.role is not Role.COLOCATED
    if pd:
        argv += ["--disaggregation-transfer-backend", spec.transfer_backend]
    if spec.role is Role.PREFILL or (pd and spec.role_switch):
        argv += ["--disaggregation-bootstrap-port", str(spec.bootstrap_port)]
    if spec.memory_saver:
        argv.append("--enable-memory-saver")
    if spec.weights_cpu_backup:
        argv.append("--enable-weights-cpu-backup")
    if pd and spec.role_switch:
        argv.append("--enable-pd-role-switch")
    if spec.metrics:
        argv.append("--enable-metrics")
    return argv + list(spec.extra_args)


def split_args(text: str) -> tuple[str, ...]:
    """``engine.sglang.extra_args`` (one shell-quoted string) -> argv items."""
    return tuple(shlex.split(text))


def worker_ports(cfg: SGLangConfig, first: int) -> tuple[int, int]:
    """(server port, bootstrap port) of the worker whose first GPU is ``first``."""
    return cfg.port + first, cfg.bootstrap_port + first


def installed_sglang() -> str | None:
    """The installed ``sglang`` package's version (None when it is not installed)."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def role_switch_wanted(setting: RoleSwitch | str, module: str) -> bool:
    """``engine.sglang.role_switch``: on, off, or auto (the installed SGLang has it: 0.5.21+;
    the facade accepts the flag and decides by its pretended version)."""
    setting = RoleSwitch(setting)
    if setting is not RoleSwitch.AUTO:
        return setting is RoleSwitch.ON
    if module != SGLANG_MODULE:
        return True
    version = installed_sglang()
    return version is not None and supports_role_switch(version)


def spec_from_config(cfg: SGLangConfig, tp: int, first_gpu: int) -> ServerSpec:
    """The ServerSpec of one worker from the ``[engine.sglang]`` table."""
    if not cfg.model_path:
        raise ConfigError(
            "engine.kind = 'sglang' needs engine.sglang.model_path: the model "
            "directory (or hub id) the SGLang servers load"
        )
    port, boot = worker_ports(cfg, first_gpu)
    return ServerSpec(
        model_path=cfg.model_path,
        tp=tp,
        host=cfg.host,
        port=port,
        bootstrap_port=boot,
        transfer_backend=cfg.transfer_backend,
        memory_saver=cfg.memory_saver,
        weights_cpu_backup=cfg.weights_cpu_backup,
        role_switch=role_switch_wanted(cfg.role_switch, cfg.module),
        module=cfg.module,
        extra_args=split_args(cfg.extra_args),
    )


__all__ = [
    "FACADE_MODULE",
    "SGLANG_MODULE",
    "TRANSFER_BACKENDS",
    "ServerProcess",
    "ServerSpec",
    "first_gpu",
    "installed_sglang",
    "launch_command",
    "role_switch_wanted",
    "spec_from_config",
    "split_args",
    "worker_ports",
]
