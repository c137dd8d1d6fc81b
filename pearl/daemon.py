"""``pearld``: the long-running PEARL daemon.

``pearld --config FILE [--state-dir DIR] [--set section.key=value ...] [--endpoint ADDR]``

Start-up: open (or create) the event log in the state directory (a second pearld on the same
directory is refused), replay it (latest snapshot + tail) and refit the workload profile from the
logged telemetry, let the controller recover (resend the commands of started steps, cancel an
expansion that never committed, complete a shrink or a GPU return), then start the actors in
dependency order, confirming each is alive; the API binds last. Worker hosts that survived a
restart re-register and are adopted; unknown ones are stopped.

Signals: SIGTERM/SIGINT stop the actors in reverse order and the worker hosts with them;
SIGUSR1 dumps every thread's traceback to stderr. Logs are one structured line per event.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pearl import config as config_mod
from pearl.core import events as ev
from pearl.core.controller import Controller, ControllerConfig
from pearl.core.errors import ConfigError, PearlError
from pearl.core.policy import PD, Borrow, Policy
from pearl.core.profile import prior_profile
from pearl.log import FileLog

log = logging.getLogger("pearl.daemon")


class StructuredFormatter(logging.Formatter):
    """``ts=... level=... component=... msg="..."``: one greppable line per event."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        msg = record.getMessage().replace('"', "'")
        line = (
            f"ts={ts}.{int(record.msecs):03d} level={record.levelname.lower()} "
            f'component={record.name} msg="{msg}"'
        )
        if record.exc_info:
            line += " exc=" + repr(self.formatException(record.exc_info))
        return line


def policy_of(cfg: config_mod.Config) -> Policy:
    return Policy(
        cfg.decision,
        pd=PD(cfg.daemon.pd),
        borrow=Borrow(cfg.daemon.borrow),
        alpha=cfg.decision.ema_alpha,
        L_max=cfg.workload.max_trajectory_tokens,
    )


def init_records(cfg: config_mod.Config) -> list[Any]:
    c = cfg.cluster
    out: list[Any] = [ev.ClusterInit(c.tp, c.training_gpus, c.reserved_gpus, c.preemptible_gpus)]
    if c.initial_preemptible:
        out.append(ev.GpusAdded(c.initial_preemptible))
    return out


def open_log(cfg: config_mod.Config, state_dir: Path) -> FileLog:
    """The event log of this state directory, created with the cluster of ``cfg`` when new."""
    event_log = FileLog(state_dir / "log", create=True)
    try:
        if event_log.last_seq == 0:
            event_log.append(init_records(cfg))
        else:
            first = next(iter(event_log.read(1, 1)))[1]
            expected = init_records(cfg)[0]
            if first != expected:
                raise ConfigError(
                    f"{state_dir} holds the log of another cluster ({first}); the config describes "
                    f"{expected}. Use another --state-dir or the config the log was created with"
                )
    except BaseException:
        event_log.close()
        raise
    return event_log


class Daemon:
    """pearld in-process: start() brings everything up, stop() takes it down in reverse."""

    def __init__(
        self,
        cfg: config_mod.Config,
        state_dir: Path,
        endpoint: str | None = None,
        keep_workers: bool = False,
    ) -> None:
        self.cfg, self.state_dir = cfg, state_dir
        self.endpoint = endpoint or cfg.daemon.endpoint
        self.keep_workers = keep_workers
        self.boot_id = secrets.token_hex(8)
        self.refs: list[Any] = []
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.event_log: FileLog | None = None

    def start(self) -> None:
        from actors import base
        from actors.api import ApiEndpoint
        from actors.control import DecisionEngine, ElasticScheduler, RuntimeTracker
        from actors.executors import InterScaleRebuilder, IntraScaleToggleManager
        from actors.launcher import LocalProcessLauncher
        from actors.messages import StateChanged
        from actors.orchestrator import Boot, Orchestrator
        from actors.router import Router
        from actors.supervisor import RoleSupervisor
        from transports.auth import ServerKeys, check_bind

        keys = ServerKeys.load(self.cfg.daemon.keys_dir) if self.cfg.daemon.keys_dir else None
        check_bind(self.endpoint, keys)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.event_log = open_log(self.cfg, self.state_dir)
        policy = policy_of(self.cfg)
        profile = prior_profile(self.cfg)
        telemetry: list[ev.Telemetry] = []
        loaded = self.event_log.load(
            visit=lambda _, r: telemetry.append(r) if isinstance(r, ev.Telemetry) else None
        )
        for t in telemetry:
            profile = policy.observe(profile, t)
        controller = Controller(policy, ControllerConfig())
        recovered = controller.recover(loaded.state, profile, time.monotonic())
        log.info(
            "replayed %d records (snapshot at %d) in %.3fs",
            loaded.state.seq,
            loaded.snapshot_seq,
            time.monotonic() - t0,
        )

        self.directory = d = base.Directory()
        self.launcher = LocalProcessLauncher(self.state_dir / "workers")
        table = recovered.state.table.to_json()
        self.address = self.endpoint  # a wildcard port is fixed once the API has bound
        self.refs.append(
            base.start(
                d,
                RoleSupervisor,
                d,
                self.launcher,
                self.cfg,
                lambda: self.address,
                str(self.state_dir),
                self.boot_id,
                initial=StateChanged(table["seq"], table),
            )
        )
        for cls in (InterScaleRebuilder, IntraScaleToggleManager, Router):
            self.refs.append(base.start(d, cls, d))
        self.refs.append(
            base.start(
                d,
                RuntimeTracker,
                d,
                self.cfg.decision.ema_alpha,
                float(self.cfg.workload.max_trajectory_tokens),
            )
        )
        self.refs.append(base.start(d, DecisionEngine, self.cfg.decision))
        self.refs.append(base.start(d, ElasticScheduler, d))
        api = base.start(d, ApiEndpoint, d, self.endpoint, self.boot_id, keys)
        self.refs.append(api)
        self.address = api.ref.proxy().address.get()  # worker hosts dial the bound address
        self.refs.append(
            base.start(
                d,
                Orchestrator,
                d,
                self.event_log,
                controller,
                recovered,
                self.cfg.daemon.snapshot_every,
                self.boot_id,
            )
        )
        self.refs[-1].ask(Boot(), 30.0)  # log and send what recovery decided, now it has a name
        for r in self.refs:
            if not r.ref.is_alive():
                raise PearlError(f"actor {r.name} did not stay alive")
        self._ticker = threading.Thread(target=self._tick, name="ticker", daemon=True)
        self._ticker.start()
        log.info(
            "pearld up at %s in %.2fs (state %s, boot %s)",
            self.address,
            time.monotonic() - t0,
            self.state_dir,
            self.boot_id,
        )

    def _tick(self) -> None:
        from actors.messages import Supervise
        from pearl.core.commands import Tick

        while not self._stop.wait(self.cfg.daemon.tick_s):
            self.directory.tell("orchestrator", Tick())
            self.directory.tell("supervisor", Supervise())

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(5.0)
        orchestrator = [r for r in self.refs if r.name == "orchestrator"]
        others = [r for r in self.refs if r.name != "orchestrator"]
        for r in orchestrator + list(reversed(others)):  # stop taking input first
            try:
                r.ref.stop(timeout=10)
            except Exception as e:  # keep going: sweep the rest
                log.warning("stopping %s: %s", r.name, e)
        if not self.keep_workers and hasattr(self, "launcher"):
            self.launcher.reap_all()
        if self.event_log is not None:
            self.event_log.close()
        log.info("pearld stopped")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pearld", description="PEARL daemon")
    p.add_argument("--config", help="TOML config (default: built-in defaults)")
    p.add_argument(
        "--state-dir", default=".pearl", help="event log and worker logs (default .pearl)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable)",
    )
    p.add_argument("--endpoint", help="where the API listens (default: daemon.endpoint)")
    p.add_argument(
        "--keep-workers",
        action="store_true",
        help="leave worker hosts running on shutdown (they re-register on restart)",
    )
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StructuredFormatter())
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    try:
        cfg = config_mod.load(args.config, args.set)
        daemon = Daemon(cfg, Path(args.state_dir), args.endpoint, args.keep_workers)
        daemon.start()
    except PearlError as e:
        print(f"pearld: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"pearld: {e}", file=sys.stderr)
        return 1
    print(f"pearld listening on {daemon.address} (pid {os.getpid()})", flush=True)
    try:
        done.wait()
    finally:
        daemon.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
