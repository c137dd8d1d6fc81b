"""A warm parent for worker hosts: it imports a host's modules once and forks a host per launch.

A torch-engine worker host spends most of its cold start importing: torch and transformers take
about 6 CPU seconds on the CPU demo's machine, before the model is built. On a machine whose
slots share the cores (the CPU demo's virtual devices), hosts that start together (pearld's
start, a borrow's first activation, a preemptible worker joining) pay it at the same time, and
the running workers lose the cores to them. The fork server pays it once: it imports the modules
named on its command line, then, for each request, forks a child that takes its own session,
environment and log file and runs ``python -m MODULE ARGV``'s ``main(argv)``. A child is an
ordinary process named by its pid; the kernel reaps it when it exits (SIGCHLD is ignored here).

Requests are JSON lines on stdin, ``{"module", "argv", "env", "log", "name"}`` (``name``, if
given, becomes the child's process name in ``ps`` and ``top``: its command line is the server's);
every line on stdout is a reply: ``{"ready": true, "pid", "loaded", "failed"}`` once the imports
are done, then ``{"pid"}`` or ``{"error"}`` per request. At end of input the server exits; its
children live on (pearld's ``--keep-workers``). It starts no thread before a fork (torch's import
starts none that a child needs), and a child re-seeds the random generators the parent imported.

    python -m actors.forkserver --preload actors.worker_host,pearl.engines.torch --state-dir S

A forked host's command line (``ps``, /proc/PID/cmdline) is the server's, with the state directory
in it; its process name is the launcher's (``pearl-w3.12``: worker 3, incarnation 12), and the
first line of its log is the command it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import shlex
import signal
import sys
import traceback
from typing import Any, BinaryIO


def serve(preload: list[str], requests: BinaryIO, replies: BinaryIO) -> int:
    loaded, failed = [], {}
    for name in preload:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as e:  # the child imports it itself (and reports the error there)
            failed[name] = f"{type(e).__name__}: {e}"
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # exited children are reaped by the kernel
    _reply(replies, {"ready": True, "pid": os.getpid(), "loaded": loaded, "failed": failed})
    while line := requests.readline():
        try:
            req = json.loads(line)
            argv = [str(a) for a in req["argv"]]
            pid = _fork(
                module=str(req["module"]),
                argv=argv,
                env=req["env"],
                log=req.get("log"),
                name=req.get("name"),
            )
        except Exception as e:  # a bad request or a failed fork: said, and the next one served
            _reply(replies, {"error": f"{type(e).__name__}: {e}"})
            continue
        _reply(replies, {"pid": pid})
    return 0


def _reply(out: BinaryIO, msg: dict[str, Any]) -> None:
    out.write(json.dumps(msg).encode() + b"\n")
    out.flush()


def _fork(
    module: str, argv: list[str], env: dict[str, str], log: str | None, name: str | None
) -> int:
    # Opened here, so that a log that cannot be written is this request's error, not a child's.
    fd = os.open(log or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
        if pid == 0:
            _child(module=module, argv=argv, env=env, log_fd=fd, name=name)  # never returns
    finally:
        os.close(fd)
    return pid


def _child(
    module: str, argv: list[str], env: dict[str, str], log_fd: int, name: str | None
) -> None:
    code = 1
    try:
        if name:
            with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
                f.write(name[:15])  # the kernel's limit
        os.setsid()  # signals to pearld's process group (a terminal's ^C) do not reach it
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own children are its to wait for
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # replaces the server's request pipe and reply pipe
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        sys.stdin = open(os.devnull)  # noqa: SIM115 - the server's reader may hold read-ahead
        server = os.getppid()  # the command first: ps shows the server's
        print(f"python -m {module} {shlex.join(argv)}  (forked by fork server {server})")
        sys.stdout.flush()
        os.environ.clear()
        os.environ.update(env)
        _reseed()
        sys.argv = [module, *argv]
        rc = importlib.import_module(module).main(argv)
        code = rc if isinstance(rc, int) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _reseed() -> None:
    """A forked child starts from its parent's generator states: draw fresh seeds."""
    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pearl-forkserver", description=__doc__.split("\n")[0])
    p.add_argument("--preload", default="", help="modules to import once, comma-separated")
    p.add_argument(
        "--state-dir",
        default="",
        help="the pearld state directory whose hosts these are (shown by ps, read by tools: a "
        "forked host's command line is the server's)",
    )
    a = p.parse_args(argv)
    preload = [m for m in a.preload.split(",") if m]
    return serve(preload, sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main())
