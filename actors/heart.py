"""A worker host's liveness: names that say which host a message came from, and the host's heart.

Every client a worker host opens to pearld is named ``worker-W.I`` or ``worker-W.I-CHANNEL``
(worker W, incarnation I), so that pearld counts any message from the host as a heartbeat
(:func:`host_of`), not only the beats. :class:`HostHeart` says hello, then keeps a
:class:`~transports.beacon.Beacon` beating from a thread of its own: neither the engine's compute
nor the WorkerActor's command handling stands between two beats (the hello reads whether an
engine exists from a flag, never through the actor's inbox). A reply with another boot id, or
one saying pearld does not know the host, means pearld restarted (or forgot the host): say hello
again. Unknown after a hello, or pearld unreachable for ``orphan_s``: the host exits.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from actors.messages import Welcome, WorkerBeat, WorkerHello
from pearl.core.errors import PearlError
from transports.auth import ClientKeys
from transports.beacon import Beacon
from transports.codec import Envelope
from transports.rpc import Client

if TYPE_CHECKING:
    import zmq

log = logging.getLogger(__name__)

_NAME = re.compile(r"worker-(\d+)\.(\d+)(?:-[a-z]+)?")


def host_name(worker: int, incarnation: int, channel: str = "") -> str:
    """The peer name of a worker host's client: ``worker-W.I`` or ``worker-W.I-CHANNEL``."""
    return f"worker-{worker}.{incarnation}" + (f"-{channel}" if channel else "")


def host_of(sender: str) -> tuple[int, int] | None:
    """(worker, incarnation) of a worker host's peer name, or None for any other sender."""
    m = _NAME.fullmatch(sender)
    return (int(m.group(1)), int(m.group(2))) if m else None


class HostHeart:
    """Hello, beats from their own thread, hello again when pearld restarts; see the module."""

    def __init__(
        self,
        endpoint: str,
        hello: WorkerHello,
        *,
        interval_s: float,
        orphan_s: float,
        ready: Callable[[], bool],
        on_beat: Callable[[], None] = lambda: None,
        on_welcome: Callable[[], None] = lambda: None,
        keys: ClientKeys | None = None,
        ctx: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        w, inc = hello.worker, hello.incarnation
        self.hello, self.interval_s, self.orphan_s = hello, interval_s, orphan_s
        self.ready, self.on_beat, self.on_welcome = ready, on_beat, on_welcome
        self.client = Client(
            endpoint, ctx=ctx, keys=keys, timeout_s=2.0, retries=1, name=host_name(w, inc)
        )
        beat = WorkerBeat(worker=w, incarnation=inc)
        self.beacon = Beacon(
            endpoint,
            lambda: beat,
            self._reply,
            interval_s=interval_s,
            name=host_name(w, inc, "beat"),
            keys=keys,
            ctx=ctx,
        )
        self.boot_id: str | None = None  # the pearld boot we said hello to
        self._fresh_after = 0  # replies to beats up to this id predate the current hello
        self._rehello = threading.Event()

    def _reply(self, env: Envelope) -> None:
        """Beacon thread: a reply to a beat."""
        msg = env.msg
        if not isinstance(msg, Welcome) or env.corr <= self._fresh_after:
            return  # an error reply, or the answer to a beat sent before the last hello
        if not msg.known or msg.boot_id != self.boot_id:
            self.beacon.paused = True
            self._rehello.set()
            return
        self.on_beat()

    def wake(self) -> None:
        """End the heart's wait at once (a stop just set: :meth:`run` returns without waiting
        out its interval). Thread-safe; from a signal handler too."""
        self._rehello.set()

    def run(self, stop: threading.Event) -> str:
        """Until ``stop`` is set (returns "stopped"), pearld forgets the host ("unknown") or stays
        unreachable for ``orphan_s`` ("orphaned")."""
        self.beacon.start()
        last_ok = time.monotonic()
        try:
            while not stop.is_set():
                if self.boot_id is None or self._rehello.is_set():
                    self.beacon.paused = True
                    try:
                        hello = msgspec.structs.replace(self.hello, engine_ready=self.ready())
                        reply = self.client.request(hello)
                    except PearlError as e:
                        if time.monotonic() - last_ok > self.orphan_s:
                            log.warning(
                                "pearld unreachable for %.0fs (%s); exiting", self.orphan_s, e
                            )
                            return "orphaned"
                        stop.wait(self.interval_s)
                        continue
                    if isinstance(reply, Welcome) and not reply.known:
                        log.info("pearld does not know this worker; exiting")
                        return "unknown"
                    self.boot_id = reply.boot_id if isinstance(reply, Welcome) else None
                    if self.boot_id is not None:
                        self.on_welcome()
                    self._fresh_after = self.beacon.last_id  # paused: no beat is in between
                    self._rehello.clear()
                    self.beacon.paused = self.boot_id is None
                    last_ok = time.monotonic()
                elif min(self.beacon.silent_s(), time.monotonic() - last_ok) > self.orphan_s:
                    log.warning("pearld silent for %.0fs; exiting", self.orphan_s)
                    return "orphaned"
                self._rehello.wait(self.interval_s)  # a re-hello (or a wake) goes at once
            return "stopped"
        finally:
            self.beacon.close()
            self.client.close()


__all__ = ["HostHeart", "host_name", "host_of"]
