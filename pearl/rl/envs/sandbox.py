"""Run one tool call in a sandboxed subprocess, asynchronously.

The child is a fresh ``python -I -S`` (isolated: no user site, no PYTHON* variables, no
site-packages) started without a shell, with an empty environment, in its own session, reading
the code on stdin. It limits itself (address space, CPU seconds, no fork, no file writes; see
``_sandbox_child.py``) before touching the code; the parent adds a wall-clock timeout and kills
the child by pid when it is exceeded or when the caller is cancelled, then reaps it. Nothing is
left running and no zombie remains.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CHILD = str(Path(__file__).with_name("_sandbox_child.py"))
MODES = ("calc", "py")


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 2.0  # wall clock, enforced by the parent (SIGKILL)
    cpu_s: int = 1  # CPU seconds, enforced by the kernel (RLIMIT_CPU: SIGXCPU, then SIGKILL)
    memory_mb: int = 256  # address space (RLIMIT_AS): a bigger allocation raises MemoryError
    max_output_chars: int = 512  # longer results are cut and say how much was cut
    max_code_chars: int = 2000  # longer tool calls are refused without starting a process


@dataclass(frozen=True)
class ToolRun:
    """The outcome of one sandboxed call; ``output`` is what the agent sees."""

    ok: bool
    output: str
    seconds: float
    pid: int = 0  # 0 when no process was started
    killed: str = ""  # "", "timeout", "cpu", or "signal N"


async def run_tool(mode: str, code: str, limits: SandboxLimits = SandboxLimits()) -> ToolRun:
    """Evaluate ``code`` with tool ``mode`` ('calc' or 'py') in a fresh sandboxed process."""
    if mode not in MODES:
        raise ValueError(f"tool mode {mode!r} is not one of {MODES}")
    t0 = time.monotonic()
    if len(code) > limits.max_code_chars:
        return ToolRun(
            False,
            f"error: the tool call has {len(code)} characters, the limit is "
            f"{limits.max_code_chars}",
            0.0,
        )
    mem = limits.memory_mb << 20
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            CHILD,
            mode,
            str(limits.cpu_s),
            str(mem),
            str(limits.max_output_chars),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={},
            cwd="/",
            start_new_session=True,
        )
    except OSError as e:  # out of processes or descriptors: the agent sees it, the run goes on
        return ToolRun(
            False, f"error: the sandbox could not start ({e.strerror or e})", time.monotonic() - t0
        )
    timed_out, out, err = False, b"", b""
    try:
        out, err = await asyncio.wait_for(proc.communicate(code.encode()), limits.timeout_s)
    except TimeoutError:
        timed_out = True
    finally:
        if proc.returncode is None:  # timed out, or the caller cancelled: kill by pid, reap
            _kill(proc.pid)
            await asyncio.shield(proc.wait())
    if timed_out:
        return ToolRun(
            ok=False,
            output=f"error: the tool ran past its {limits.timeout_s:g} s time limit and was killed",
            seconds=time.monotonic() - t0,
            pid=proc.pid,
            killed="timeout",
        )
    return tool_result(
        rc=proc.returncode, out=out, err=err, seconds=time.monotonic() - t0, pid=proc.pid
    )


def tool_result(rc: int | None, out: bytes, err: bytes, seconds: float, pid: int) -> ToolRun:
    """What a finished sandbox run comes to: its JSON reply on ``out``, or, killed by a signal
    (``rc`` < 0; SIGXCPU: its CPU limit) or crashed (no reply: the last line of ``err``), an
    error the agent reads as its observation."""
    if rc is not None and rc < 0:
        sig = -rc
        if sig == signal.SIGXCPU:
            return ToolRun(
                ok=False,
                output="error: the tool used up its CPU time limit and was killed",
                seconds=seconds,
                pid=pid,
                killed="cpu",
            )
        return ToolRun(
            ok=False,
            output=f"error: the tool was killed by signal {sig}",
            seconds=seconds,
            pid=pid,
            killed=f"signal {sig}",
        )
    try:
        reply = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
        return ToolRun(ok=bool(reply["ok"]), output=str(reply["out"]), seconds=seconds, pid=pid)
    except (IndexError, ValueError, KeyError, TypeError):
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return ToolRun(
            ok=False,
            output=f"error: the tool crashed (exit {rc}) {tail[0][:200]}",
            seconds=seconds,
            pid=pid,
        )


def _kill(pid: int) -> None:
    """SIGKILL the sandbox (its own session: the group too); gone already is fine."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


__all__ = ["CHILD", "MODES", "SandboxLimits", "ToolRun", "run_tool", "tool_result"]
