"""Launching and supervising one SGLang server per worker: the command line and the process.

:func:`launch_command` is pure: it turns a :class:`ServerSpec` (the worker's role plus the
``[engine]`` settings) into ``python -m sglang.launch_server ...`` with the flags of the role.
:class:`ServerProcess` starts that command, keeps its output in a log file, and stops it by pid
(SIGTERM, then SIGKILL); on Linux the server also dies with its worker host (PDEATHSIG), so a
crashed host never leaves a server holding its GPUs and port.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from pearl.core.state import Role
from pearl.engines.base import EngineError
from pearl.engines.sglang.protocol import MODES

SGLANG_MODULE = "sglang.launch_server"
FACADE_MODULE = "pearl.engines.torch.http"  # the torch engine speaking SGLang's dialect
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
        raise EngineError(f"an SGLang server serves as one of {[r.value for r in MODES]}, "
                          f"not {spec.role}")
    if spec.tp < 1:
        raise EngineError(f"tp must be >= 1, got {spec.tp}")
    if not spec.model_path:
        raise EngineError("an SGLang server needs a model path (engine.sglang_model_path)")
    if spec.transfer_backend not in TRANSFER_BACKENDS:
        raise EngineError(f"transfer backend {spec.transfer_backend!r} is not one of "
                          f"{', '.join(TRANSFER_BACKENDS)}")
    argv = [spec.python, "-m", spec.module, "--model-path", spec.model_path,
            "--tp", str(spec.tp), "--host", spec.host, "--port", str(spec.port),
            "--disaggregation-mode", MODES[spec.role]]
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
    """``engine.sglang_extra_args`` (one shell-quoted string) -> argv items."""
    return tuple(shlex.split(text))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ServerProcess:
    """One running server: started from its argv, stopped by pid, output in ``log_path``."""

    def __init__(self, argv: list[str], log_path: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.argv = argv
        fd, default = tempfile.mkstemp(prefix="pearl-sglang-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log_path or default)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        try:
            self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                         env=env, preexec_fn=preexec)  # noqa: PLW1509
        except OSError as e:
            self._log.close()
            raise EngineError(f"cannot start {shlex.join(argv)}: {e}") from None
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 20) -> str:
        """The last lines of the server's output (for error messages)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM, wait, then SIGKILL; idempotent."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(10)
        if not self._log.closed:
            self._log.close()


__all__ = ["FACADE_MODULE", "SGLANG_MODULE", "TRANSFER_BACKENDS", "ServerProcess", "ServerSpec",
           "launch_command", "split_args"]
