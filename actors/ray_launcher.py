"""Worker hosts as Ray actors on the nodes that hold their GPUs (``[daemon] launcher = "ray"``).

pearld joins a running Ray cluster as a driver (``[ray] address``). Each worker host is a
detached, named actor (``pearl-host-W.I`` in ``[ray] namespace``) placed with hard node affinity on
the node holding the worker's GPUs (:mod:`actors.ray_nodes`), reserving that many of Ray's GPUs
there; the actor runs ``python -m actors.worker_host`` as its own child process, with
``CUDA_VISIBLE_DEVICES`` set to the GPUs' local accelerator ids, and the child dies with it
(``PR_SET_PDEATHSIG``). The host's CURVE keys travel in the actor's arguments and reach the child
on its stdin: no key file on the other node. A host on another node dials pearld's routable
address and binds its own command server and KV inbox on its node's address.

A handle is the actor's name: the RoleSupervisor asks :meth:`RayLauncher.alive` and
:meth:`RayLauncher.cpu_s` from what a poller thread last read (the actor's child running, its CPU
seconds), never waiting on Ray itself. Detached actors outlive pearld: a pearld restarted with the
same namespace adopts the hosts by name when they say hello again. Ray is imported only here, and
only when this launcher is asked for.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from actors.launcher import Handle, LaunchError, WorkerSpec, host_args
from actors.messages import WorkerHello
from actors.ray_nodes import RayNode, check_placement, placement, read_nodes
from pearl.config import Config, EngineKind, format_gpus
from pearl.core.address import advertised
from pearl.core.errors import ConfigError
from transports.auth import HostKeys, is_local

log = logging.getLogger(__name__)

PREFIX = "pearl-host-"
CONNECT_S = 3.0  # an unreachable ray.address fails within this


def actor_name(worker: int, incarnation: int) -> str:
    return f"{PREFIX}{worker}.{incarnation}"


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            'daemon.launcher = "ray" needs Ray, which is not installed here: '
            "pip install -e '.[ray]' (or set daemon.launcher = \"local\")"
        ) from None
    return ray


def connect(cfg: Config) -> tuple[ModuleType, bool]:
    """Ray, connected to ``[ray] address`` (an existing connection is kept); True when this call
    connected (so closing the launcher disconnects)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    address = cfg.ray.address
    if address != "auto":
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=CONNECT_S).close()
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"ray.address = {address!r}: cannot reach a Ray cluster there "
                f"({getattr(e, 'strerror', None) or e}); start one (ray start --head) or fix "
                "ray.address (HOST:PORT of its head, or auto)"
            ) from None
    try:
        ray.init(
            address=address,
            namespace=cfg.ray.namespace,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    except Exception as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(
            f"ray.address = {address!r}: cannot join the Ray cluster: {why}"
        ) from None
    return ray, True


class RayLauncher:
    """One detached Ray actor per worker host, on the node that holds its GPUs."""

    def __init__(
        self, cfg: Config, ray: ModuleType, owned: bool, log_dir: Path | None = None
    ) -> None:
        self.cfg, self.ray, self.owned, self.log_dir = cfg, ray, owned, log_dir
        self.namespace = cfg.ray.namespace
        self.keys = HostKeys.load(cfg.daemon.keys_dir).to_text() if cfg.daemon.keys_dir else None
        self.here = ray.util.get_node_ip_address()
        self._actors: dict[str, Any] = {}  # name -> ActorHandle, ours to stop
        self._seen: dict[str, tuple[bool, float | None]] = {}  # name -> (running, CPU s)
        self._probing: dict[str, Any] = {}  # name -> the probe in flight
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="ray-hosts", daemon=True)
        self._poller.start()

    @classmethod
    def connect(cls, cfg: Config, endpoint: str, log_dir: Path | None = None) -> RayLauncher:
        """Join the cluster and check that it can run ``cfg``; one-line ConfigError if not
        (before pearld logs or launches anything)."""
        ray, owned = connect(cfg)
        try:
            nodes = read_nodes(ray)
            placed = check_placement(cfg, list(nodes.values()))
            here = ray.util.get_node_ip_address()
            away = sorted({n.address for n, _ in placed.values() if n.address != here})
            if is_local(endpoint) and away:
                raise ConfigError(
                    f"pearld listens on {endpoint}, which hosts on other machines "
                    f"({', '.join(away)}) cannot reach; bind a routable address "
                    "(--endpoint tcp://0.0.0.0:7440) with CURVE keys (daemon.keys_dir)"
                )
            return cls(cfg, ray, owned, log_dir)
        except BaseException:
            if owned:
                ray.shutdown()
            raise

    # -- the Launcher protocol ---------------------------------------------------------------

    def launch(self, spec: WorkerSpec) -> Handle:
        ray = self.ray
        placed = placement(self.cfg, read_nodes(ray).values())
        where = {placed[g][0].node_id for g in spec.gpus if g in placed}
        if len(where) != 1 or any(g not in placed for g in spec.gpus):
            raise LaunchError(
                f"worker host {spec.worker} (incarnation {spec.incarnation}): GPUs "
                f"{format_gpus(spec.gpus)} are not all held by one live Ray node "
                f"({len(where)} nodes hold some of them)"
            )
        node: RayNode = placed[spec.gpus[0]][0]
        name = actor_name(spec.worker, spec.incarnation)
        self._drop_stale(name)
        env = {}
        if spec.engine.kind is not EngineKind.SIM:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(placed[g][1]) for g in spec.gpus)
        endpoint = self._routable(spec.endpoint)
        args = host_args(dataclasses.replace(spec, endpoint=endpoint), python="python")
        args += ["--handle", name, *(["--keys-stdin"] if self.keys else [])]
        log_path = (
            str(self.log_dir / f"worker-{spec.worker}-{spec.incarnation}.log")
            if self.log_dir is not None
            else ""
        )
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        try:
            actor = (
                ray.remote(HostProcess)
                .options(
                    name=name,
                    namespace=self.namespace,
                    lifetime="detached",
                    num_cpus=0,
                    num_gpus=len(spec.gpus),
                    max_restarts=0,
                    max_concurrency=4,  # a probe or a stop never waits behind another call
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
                )
                .remote(args, env, self.keys, not is_local(endpoint), log_path)
            )
        except Exception as e:
            raise LaunchError(
                f"worker host {spec.worker} (incarnation {spec.incarnation}) could not be "
                f"started on {node.named()}: {e}"
            ) from None
        with self._lock:
            self._actors[name] = actor
            self._seen[name] = (True, None)  # starting: alive until Ray says otherwise
        return name

    def alive(self, handle: Handle) -> bool:
        with self._lock:
            return self._seen.get(str(handle), (False, None))[0]

    def cpu_s(self, handle: Handle) -> float | None:
        with self._lock:
            return self._seen.get(str(handle), (False, None))[1]

    def handle_of(self, hello: WorkerHello) -> Handle:
        return hello.handle or hello.pid

    def adopt(self, handle: Handle) -> None:
        """A host that said hello (after a pearld restart): its actor, found by name."""
        name = str(handle)
        if not name.startswith(PREFIX) or name in self._actors:
            return
        try:
            actor = self.ray.get_actor(name, namespace=self.namespace)
        except ValueError:  # gone meanwhile: its heartbeats stop and it is declared dead
            return
        with self._lock:
            self._actors[name] = actor
            self._seen.setdefault(name, (True, None))

    def kill(self, handle: Handle, force: bool = False) -> None:
        name = str(handle)
        with self._lock:
            actor = self._actors.pop(name, None)
            self._seen[name] = (False, None)
            self._probing.pop(name, None)
        if actor is None:
            actor = self._find(name)
        if actor is None:
            return
        if not force:  # SIGTERM to the host first: a clean stop
            with contextlib.suppress(Exception):
                self.ray.get(actor.stop.remote(False), timeout=5.0)
        with contextlib.suppress(Exception):
            self.ray.kill(actor, no_restart=True)

    def reap_all(self, timeout_s: float = 3.0) -> None:
        with self._lock:
            actors, self._actors = dict(self._actors), {}
        stops = []
        for actor in actors.values():
            with contextlib.suppress(Exception):
                stops.append(actor.stop.remote(False))
        if stops:
            with contextlib.suppress(Exception):
                self.ray.wait(stops, num_returns=len(stops), timeout=timeout_s)
        for actor in actors.values():
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)

    def close(self) -> None:
        self._closing.set()
        self._poller.join(5.0)
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()

    # -- inside ------------------------------------------------------------------------------

    def _find(self, name: str) -> Any:
        if not name.startswith(PREFIX):
            return None
        try:
            return self.ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return None

    def _drop_stale(self, name: str, timeout_s: float = 10.0) -> None:
        """An actor of this name from an earlier launch (or pearld): stop it, free the name."""
        stale = self._find(name)
        if stale is None:
            return
        with contextlib.suppress(Exception):
            self.ray.kill(stale, no_restart=True)
        deadline = time.monotonic() + timeout_s
        while self._find(name) is not None and time.monotonic() < deadline:
            time.sleep(0.05)

    def _routable(self, endpoint: str) -> str:
        """pearld's address as a host elsewhere dials it: a wildcard host is this node's IP."""
        return advertised(endpoint, self.here)

    def _poll(self) -> None:
        """Read each host's actor: its child running, its CPU seconds; never block the caller."""
        ray = self.ray
        from ray.exceptions import GetTimeoutError

        while not self._closing.wait(self.cfg.ray.poll_s):
            with self._lock:
                for name, actor in self._actors.items():
                    if name not in self._probing:
                        with contextlib.suppress(Exception):
                            self._probing[name] = actor.probe.remote()
                probing = dict(self._probing)
            if not probing:
                continue
            refs = list(probing.values())
            try:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.cfg.ray.poll_s)
            except Exception:  # the connection is going away
                continue
            done = {id(r) for r in ready}
            for name, ref in probing.items():
                if id(ref) not in done:
                    with self._lock:  # no answer yet: no evidence of work
                        if name in self._seen:
                            self._seen[name] = (self._seen[name][0], None)
                    continue
                try:
                    running, cpu = ray.get(ref, timeout=0)
                except GetTimeoutError:
                    continue
                except Exception:  # the actor died, or could not be placed
                    running, cpu = False, None
                with self._lock:
                    if self._probing.get(name) is ref:
                        del self._probing[name]
                        if name in self._actors:
                            self._seen[name] = (running, cpu)


_PR_SET_PDEATHSIG = 1


class HostProcess:
    """The Ray actor of one worker host: runs it as a child that dies with the actor."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        keys: dict[str, str] | None,
        routable: bool,
        log_path: str,
    ) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        args = [sys.executable, *args[1:], "--node-id", self.node_id]
        if routable:  # reachable from pearld and the other hosts: bind this node's address
            ip = ray.util.get_node_ip_address()
            args += ["--bind-host", ip]
            if "--metrics" in args:  # Prometheus on pearld's machine scrapes it here
                k = args.index("--metrics") + 1
                args[k] = args[k].replace("127.0.0.1:", f"{ip}:")
        self.proc: subprocess.Popen[bytes] | None = None
        self.error = ""
        started = threading.Event()
        # The thread that forks the child waits for it: PR_SET_PDEATHSIG fires when the forking
        # thread ends, so it must live as long as the child (it does: it waits on it).
        threading.Thread(
            target=self._run,
            args=(args, {**os.environ, **env}, keys, log_path, started),
            name="worker-host",
            daemon=True,
        ).start()
        started.wait(30.0)
        if self.proc is None:
            raise RuntimeError(f"worker host could not be started: {self.error or 'timed out'}")

    def _run(
        self,
        args: list[str],
        env: dict[str, str],
        keys: dict[str, str] | None,
        log_path: str,
        started: threading.Event,
    ) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        out: IO[bytes] | None = None  # inherit the actor's output: Ray's worker log on this node
        try:
            if log_path:  # the same path on this node (the state dir, where it is shared)
                with contextlib.suppress(OSError):
                    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
                    out = open(log_path, "ab")  # noqa: SIM115 - the child owns it
            proc = subprocess.Popen(
                args,
                env=env,
                stdin=subprocess.PIPE if keys else subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL),
            )
            if keys and proc.stdin is not None:
                proc.stdin.write(json.dumps(keys).encode() + b"\n")
                proc.stdin.close()
        except OSError as e:
            self.error = str(e)
            started.set()
            return
        finally:
            if out is not None:
                out.close()
        self.proc = proc
        started.set()
        proc.wait()
        self._end()

    def _end(self) -> None:
        """The host exited (stopped, orphaned, or told pearld does not know it): so does its
        actor, freeing its name and its GPUs."""
        import ray

        try:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        except Exception:
            os._exit(0)

    def probe(self) -> tuple[bool, float | None]:
        """(its child runs, the CPU seconds it used while it can run)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return False, None
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return True, None
        if fields[0] in ("T", "t", "Z", "X", "x"):
            return True, None
        return True, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def where(self) -> tuple[str, int]:
        """(the Ray node id, the host's pid): for tests and operators."""
        return self.node_id, self.proc.pid if self.proc is not None else 0

    def stop(self, force: bool = False) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL if force else signal.SIGTERM)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


__all__ = ["PREFIX", "HostProcess", "RayLauncher", "actor_name", "connect", "import_ray"]
