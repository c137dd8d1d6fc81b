"""An in-process engine behind SGLang's HTTP dialect: ``python -m pearl.engines.facade ...``.

It takes ``sglang.launch_server``'s flags (``--model-path`` is a preset such as ``tiny`` or a local
Qwen3 directory, or ``sim`` for the sim engine's cost model; unknown flags are ignored) and serves
the subset of SGLang's endpoints PEARL uses, with SGLang's payloads, backed by a real
:class:`TorchEngine` (or a :class:`SimEngine`). So one client
(:mod:`pearl.engines.sglang.client`) drives real SGLang servers and this facade, and CI exercises
it against real model compute. ``--pretend-version`` picks the endpoint generation: before 0.5.5
``/get_server_info`` and ``/get_model_info``, from it ``/server_info`` and ``/model_info``, from
0.5.21 ``/pd_role_switch``.

PD works as in SGLang: the same ``/generate`` body with ``bootstrap_host/port/room`` goes to a
prefill and a decode facade. The decode facade registers the room and its KV inbox with the
prefill facade's bootstrap server (a second HTTP port, ``--disaggregation-bootstrap-port``); the
prefill facade's engine then ships the KV over the torch engine's ZeroMQ KV channel under the room.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec

from pearl.core.state import Role
from pearl.engines.base import EngineError, GenerateResult, KVTimeout
from pearl.engines.facade_state import Counters, Rooms
from pearl.engines.in_process import InProcessEngine
from pearl.engines.sglang import protocol as P
from pearl.engines.web import call
from transports.bulk import ZmqKVChannel

log = logging.getLogger("pearl.facade")
NEW_INFO_SINCE = (0, 5, 5)  # the facade's cut-over to /server_info and /model_info
Reply = tuple[int, Any]


SIM = "sim"  # --model-path sim: the sim engine's cost model instead of a torch model


def _torch_engine(a: argparse.Namespace, role: Role, kv: ZmqKVChannel) -> InProcessEngine:
    from pearl.engines.torch.engine import TorchEngine

    preset, path = (a.model_path, "") if not Path(a.model_path).is_dir() else ("tiny", a.model_path)
    return TorchEngine(
        role=role,
        kv_channel=kv,
        preset=preset,
        model_path=path,
        threads=a.threads,
        seed=a.seed,
        kv_budget_bytes=int(a.kv_budget_mb * (1 << 20)),
        kv_timeout_s=a.kv_timeout_s,
        keep_cpu_copy=a.enable_weights_cpu_backup,
    )


def _sim_engine(a: argparse.Namespace, role: Role, kv: ZmqKVChannel) -> InProcessEngine:
    """The sim engine of ``--sim-model`` on ``--sim-gpu`` x ``--tp``: SGLang's API over the same
    cost model pearld's sim workers run, so benchmarks can put HTTP clients and real routers in
    front of sim workers."""
    from pearl.engines.factory import sim_cost
    from pearl.engines.sim import SimEngine

    cost = sim_cost(a.sim_model, a.sim_gpu, a.tp, start_s=a.sim_start_s)
    return SimEngine(cost=cost, role=role, kv_channel=kv, time_scale=a.sim_time_scale)


class Facade:
    """The server state: one engine, its KV channel, the bootstrap rooms, the counters."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.version = a.pretend_version
        self.mode = a.disaggregation_mode
        self.kv = ZmqKVChannel()
        self.engine: InProcessEngine = (
            _sim_engine(a, P.ROLES[self.mode], self.kv)
            if a.model_path == SIM
            else _torch_engine(a, P.ROLES[self.mode], self.kv)
        )
        self.weight_version = "0"
        self.rooms = Rooms()
        self.counters = Counters()
        self.boot_server: ThreadingHTTPServer | None = None
        self.group: Any = None  # torch.distributed group of a weight broadcast
        self.routes: dict[tuple[str, str], Callable[[dict[str, Any]], Reply]] = {}
        new = P.parse_version(self.version) >= NEW_INFO_SINCE
        info, model = (
            ("/server_info", "/model_info") if new else ("/get_server_info", "/get_model_info")
        )
        for method, path, fn in [
            ("GET", "/health", self.health),
            ("GET", "/health_generate", self.health),
            ("GET", info, self.server_info),
            ("GET", model, self.model_info),
            ("POST", "/generate", self.generate),
            ("POST", "/abort_request", self.abort),
            ("POST", "/pause_generation", self.pause),
            ("POST", "/continue_generation", self.resume_generation),
            ("POST", "/release_memory_occupation", self.release),
            ("POST", "/resume_memory_occupation", self.resume),
            ("POST", "/update_weights_from_disk", self.update_from_disk),
            ("POST", "/init_weights_update_group", self.init_group),
            ("POST", "/update_weights_from_distributed", self.update_from_distributed),
            ("POST", "/destroy_weights_update_group", self.destroy_group),
            ("GET", "/flush_cache", self.health),
            ("POST", "/flush_cache", self.health),
            ("GET", "/metrics", self.metrics),
        ]:
            self.routes[(method, path)] = fn
        if P.supports_role_switch(self.version):
            self.routes[("POST", "/pd_role_switch")] = self.role_switch

    # -- identity ------------------------------------------------------------------------------

    def health(self, _: dict[str, Any]) -> Reply:
        return 200, None

    def server_info(self, _: dict[str, Any]) -> Reply:
        a = self.a
        return 200, {
            "version": self.version,
            "model_path": a.model_path,
            "tp_size": a.tp,
            "host": a.host,
            "port": a.port,
            "disaggregation_mode": self.mode,
            "disaggregation_bootstrap_port": a.disaggregation_bootstrap_port,
            "disaggregation_transfer_backend": a.disaggregation_transfer_backend,
            "enable_memory_saver": a.enable_memory_saver,
            "enable_weights_cpu_backup": a.enable_weights_cpu_backup,
            "enable_pd_role_switch": a.enable_pd_role_switch,
            "enable_metrics": a.enable_metrics,
            "weight_version": self.weight_version,
            "internal_states": [self.engine.kv_usage()],
        }

    def model_info(self, _: dict[str, Any]) -> Reply:
        return 200, {
            "model_path": self.a.model_path,
            "tokenizer_path": None,
            "is_generation": True,
            "weight_version": self.weight_version,
        }

    # -- generation ----------------------------------------------------------------------------

    def generate(self, body: dict[str, Any]) -> Reply:
        t0 = time.monotonic()
        req, boot = P.request_of(body)
        if self.mode != "null":
            if boot is None:
                raise EngineError(
                    f"a {self.mode} server needs bootstrap_host, bootstrap_port and bootstrap_room"
                )
            tid = f"room-{boot.room}"
            if self.mode == "prefill":
                peer = self.rooms.wait(boot.room, self.a.kv_timeout_s)
                if peer is None:
                    return 200, _abort_body(
                        req.rid,
                        f"no decode server joined bootstrap room "
                        f"{boot.room} within {self.a.kv_timeout_s}s",
                    )
                req = msgspec.structs.replace(req, transfer_id=tid, kv_peer=peer)
            else:
                self._join_room(boot)
                req = msgspec.structs.replace(req, transfer_id=tid)
        try:
            result: GenerateResult = self.engine.generate(req).result()
        except KVTimeout as e:  # SGLang aborts a decode request whose KV never came
            return 200, _abort_body(req.rid, str(e))
        return 200, P.response_body(result, self.weight_version, time.monotonic() - t0)

    def _join_room(self, boot: P.Bootstrap) -> None:
        """Decode side: tell the prefill facade where to ship this room's KV."""
        url = f"http://{boot.host}:{boot.port}/bootstrap/register"
        deadline = time.monotonic() + self.a.kv_timeout_s
        while True:
            try:
                call(
                    url=url,
                    method="POST",
                    payload={"room": boot.room, "kv_address": self.kv.address},
                    timeout_s=5.0,
                )
                return
            except EngineError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def abort(self, body: dict[str, Any]) -> Reply:
        if body.get("abort_all"):
            self.engine.abort_all()
        elif body.get("rid"):  # SGLang matches by prefix: "r1" also aborts "r10"
            rid = str(body["rid"])
            for r in self.engine.in_flight():
                if r.startswith(rid):
                    self.engine.abort(r)
        return 200, None

    def pause(self, _: dict[str, Any]) -> Reply:
        self.engine.pause_generation()
        return 200, None

    def resume_generation(self, _: dict[str, Any]) -> Reply:
        self.engine.continue_generation()
        return 200, None

    # -- memory and weights --------------------------------------------------------------------

    def release(self, body: dict[str, Any]) -> Reply:
        if not self.a.enable_memory_saver:
            return 400, _err("release_memory_occupation needs --enable-memory-saver")
        if self.engine.in_flight():
            return 400, _err(
                f"release_memory_occupation needs an idle server; "
                f"{len(self.engine.in_flight())} requests are running"
            )
        self.engine.release_memory()
        return 200, None

    def resume(self, body: dict[str, Any]) -> Reply:
        self.engine.resume_memory()
        return 200, None

    def _version_of(self, body: dict[str, Any]) -> int:
        wv = str(body.get("weight_version") or "")
        return int(wv) if wv.isdigit() else self.engine.weights_version + 1

    def update_from_disk(self, body: dict[str, Any]) -> Reply:
        path = Path(str(body.get("model_path", "")))
        if path.is_dir() and not (path / "config.json").exists():
            files = [f for f in path.iterdir() if f.suffix in (".safetensors", ".bin", ".pt")]
            path = files[0] if len(files) == 1 else path
        version = self._version_of(body)
        try:
            self.engine.load_weights(version, str(path))
        except EngineError as e:
            return 400, {"success": False, "message": str(e), "num_paused_requests": 0}
        self.weight_version = str(body.get("weight_version") or version)
        return 200, {
            "success": True,
            "message": f"loaded {path} as version {version}",
            "num_paused_requests": 0,
        }

    def init_group(self, body: dict[str, Any]) -> Reply:
        import torch.distributed as dist

        # gloo: the facade computes on CPU; SGLang would use the requested backend (nccl).
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{body['master_address']}:{body['master_port']}",
            world_size=int(body["world_size"]),
            rank=int(body["rank_offset"]),
        )
        self.group = body.get("group_name", "weight_update_group")
        return 200, {"success": True, "message": "joined the weight update group"}

    def update_from_distributed(self, body: dict[str, Any]) -> Reply:
        import torch
        import torch.distributed as dist

        model = getattr(self.engine, "model", None)  # the sim engine has none
        if self.group is None or model is None:
            return 400, {
                "success": False,
                "message": "no weight update group, or memory "
                "released: init_weights_update_group / resume first",
            }
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"], strict=True):
            t = torch.empty([int(s) for s in shape], dtype=getattr(torch, dtype))
            dist.broadcast(t, src=0)
            state[name] = t
        version = self._version_of(body)
        self.engine.load_weights(version, state)
        self.weight_version = str(body.get("weight_version") or version)
        return 200, {"success": True, "message": f"received {len(body['names'])} tensors"}

    def destroy_group(self, body: dict[str, Any]) -> Reply:
        import torch.distributed as dist

        if self.group is not None:
            dist.destroy_process_group()
            self.group = None
        return 200, {"success": True, "message": "left the weight update group"}

    # -- roles and metrics ---------------------------------------------------------------------

    def role_switch(self, body: dict[str, Any]) -> Reply:
        new, old = str(body.get("new_role", "")), self.mode

        def refuse(message: str) -> Reply:
            return 400, {"success": False, "message": message, "old_role": old, "new_role": new}

        if not self.a.enable_pd_role_switch:
            return refuse("role switch is disabled: launch with --enable-pd-role-switch")
        if new not in ("prefill", "decode"):
            return refuse(f"invalid new_role {new!r}: prefill or decode")
        if old == "null":
            return refuse("not running in PD mode (--disaggregation-mode null)")
        if new == old:
            return 200, {
                "success": True,
                "message": "already in target role",
                "old_role": old,
                "new_role": new,
            }
        if self.engine.in_flight():
            return refuse(f"server is not idle: {len(self.engine.in_flight())} requests")
        self.engine.set_role(Role(new))
        self.mode = new
        if new == "prefill":
            self.start_bootstrap()
        return 200, {"success": True, "message": "switched", "old_role": old, "new_role": new}

    def metrics(self, _: dict[str, Any]) -> Reply:
        if not self.a.enable_metrics:
            return 404, _err("metrics are off: launch with --enable-metrics")
        self.counters.add(self.engine.telemetry())
        values = self.counters.values(len(self.engine.in_flight()))
        return 200, P.render_metrics(values, f'model_name="{self.a.model_path}"')

    # -- serving -------------------------------------------------------------------------------

    def start_bootstrap(self) -> None:
        if self.boot_server is not None:
            return
        rooms = self.rooms

        def register(body: dict[str, Any]) -> Reply:
            rooms.register(int(body["room"]), str(body["kv_address"]))
            return 200, None

        port = self.a.disaggregation_bootstrap_port
        self.boot_server = serve(self.a.host, port, {("POST", "/bootstrap/register"): register})


def serve(
    host: str,
    port: int,
    routes: dict[tuple[str, str], Callable[[dict[str, Any]], Reply]],
) -> ThreadingHTTPServer:
    """A threading HTTP server dispatching JSON bodies to ``routes``; serves in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            fn = routes.get((self.command, self.path.split("?")[0]))
            if fn is None:
                return self._send(404, _err(f"{self.command} {self.path} is not served"))
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}") if n else {}
                status, out = fn(body if isinstance(body, dict) else {})
            except (EngineError, KeyError, TypeError, ValueError, RuntimeError) as e:
                status, out = 400, _err(f"{type(e).__name__}: {e}")
            self._send(status, out)

        def _send(self, status: int, out: object) -> None:
            data = out.encode() if isinstance(out, str) else json.dumps(out).encode()
            if out is None:
                data = b""
            self.send_response(status)
            kind = "text/plain" if isinstance(out, str) else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = _handle

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug(fmt, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=f"http-{port}", daemon=True).start()
    return server


def _err(message: str) -> dict[str, Any]:
    return {"error": {"message": message}}


def _abort_body(rid: str, message: str) -> dict[str, Any]:
    return {
        "text": "",
        "output_ids": [],
        "meta_info": {
            "id": rid,
            "finish_reason": {"type": "abort", "message": message},
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cached_tokens": 0,
        },
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pearl.engines.facade")
    p.add_argument("--model-path", required=True)
    p.add_argument("--tp", "--tp-size", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disaggregation-mode", choices=sorted(P.ROLES), default="null")
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    for flag in (
        "--enable-memory-saver",
        "--enable-weights-cpu-backup",
        "--enable-pd-role-switch",
        "--enable-metrics",
    ):
        p.add_argument(flag, action="store_true")
    p.add_argument("--pretend-version", default="0.5.21", help="SGLang version to behave as")
    p.add_argument("--kv-timeout-s", type=float, default=30.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kv-budget-mb", type=float, default=64.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--sim-model", default="qwen3-8b", help="with --model-path sim: its catalog model"
    )
    p.add_argument("--sim-gpu", default="H800", help="with --model-path sim: its catalog GPU")
    p.add_argument("--sim-time-scale", type=float, default=0.001, help="wall s per model s")
    p.add_argument("--sim-start-s", type=float, default=60.0, help="model seconds to start")
    a, unknown = p.parse_known_args(argv)
    if unknown:
        log.warning("ignoring flags the facade does not model: %s", " ".join(unknown))
    return a


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s facade %(levelname)s %(message)s")
    a = parse_args(argv)
    facade = Facade(a)
    facade.engine.start()
    if a.disaggregation_mode == "prefill" or a.enable_pd_role_switch:
        facade.start_bootstrap()
    server = serve(a.host, a.port, facade.routes)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info(
        "serving %s as SGLang %s (%s) on %s:%d",
        a.model_path,
        facade.version,
        a.disaggregation_mode,
        a.host,
        a.port,
    )
    while not stop.wait(0.5):
        pass
    server.shutdown()
    if facade.boot_server is not None:
        facade.boot_server.shutdown()
    facade.engine.stop()
    facade.kv.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
