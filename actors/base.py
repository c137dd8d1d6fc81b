"""Actors addressed by name: a local one through its pykka inbox, a remote one over ZeroMQ.

:class:`Directory` maps names (:mod:`actors.names`) to refs with the same two methods,
``tell(msg)`` and ``ask(msg, timeout_s)``, so an actor cannot tell whether its peer lives in its
process. Messages are registered, typed records; over ZeroMQ they travel inside a
``call`` message (``method`` is ``tell`` or ``ask``, ``args = {"msg": wire mapping}``) and are
decoded by the one codec on the other side. An rpc :class:`~transports.rpc.Server` handler built
by :func:`serve_directory` delivers them to local actors.

:class:`PearlActor` dispatches on the message's type to the method its ``handles`` map gives
(the function itself, so every handler is referenced where it is wired). A failure while
handling a ``tell`` stops a pykka actor; ``on_failure`` reports it to the supervisor callback so
the daemon can restart the actor from the logged state (conventions §5).

A :class:`PearlError` raised while answering an ``ask`` is an answer, not a fault: the caller gets
it and says it once (a refused event is one warning line, by the ElasticScheduler). pykka logs
every exception it returns to a caller with its traceback, once per actor along the chain of
asks; :class:`AnswerFilter` drops those records for PearlErrors and keeps them for anything else.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, ClassVar, Protocol

import pykka

from pearl.core.errors import PearlError
from pearl.core.schema import to_wire
from transports.codec import Envelope, Unencodable, lookup
from transports.protocol import Call, Result
from transports.rpc import Client

log = logging.getLogger(__name__)

DEFAULT_ASK_S = 10.0


class AnswerFilter(logging.Filter):
    """Drops pykka's "Exception returned from ... to caller" record when the exception is a
    :class:`PearlError`: the caller receives it and reports it (an unexpected exception, a bug,
    keeps its traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        returned = isinstance(record.msg, str) and record.msg.startswith("Exception returned")
        return not (returned and isinstance(exc, PearlError))


_ANSWERS = AnswerFilter()
logging.getLogger("pykka").addFilter(_ANSWERS)


class ActorUnavailable(PearlError):
    """No actor is registered under that name, or it stopped."""


class Ref(Protocol):
    name: str

    def tell(self, msg: object) -> None: ...

    def ask(self, msg: object, timeout_s: float = DEFAULT_ASK_S) -> Any: ...


class LocalRef:
    """A pykka actor in this process."""

    def __init__(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        self.name, self.ref = name, ref

    def tell(self, msg: object) -> None:
        try:
            self.ref.tell(msg)
        except pykka.ActorDeadError:
            raise ActorUnavailable(f"actor {self.name} has stopped") from None

    def ask(self, msg: object, timeout_s: float = DEFAULT_ASK_S) -> Any:
        try:
            return self.ref.ask(msg, timeout=timeout_s)
        except pykka.ActorDeadError:
            raise ActorUnavailable(f"actor {self.name} has stopped") from None
        except pykka.Timeout:
            raise ActorUnavailable(
                f"actor {self.name} did not answer within {timeout_s}s"
            ) from None


class RemoteRef:
    """An actor in another process, reached through that process's rpc server."""

    def __init__(self, name: str, client: Client) -> None:
        self.name, self.client = name, client

    def tell(self, msg: object) -> None:
        self.client.request(Call(actor=self.name, method="tell", args={"msg": to_wire(msg)}))

    def ask(self, msg: object, timeout_s: float = DEFAULT_ASK_S) -> Any:
        reply = self.client.request(
            Call(actor=self.name, method="ask", args={"msg": to_wire(msg)}), timeout_s
        )
        value = reply.value if isinstance(reply, Result) else reply
        return decode_value(value)


class CourierRef(RemoteRef):
    """A remote actor whose tells leave from a background thread, in order, so that the sending
    actor never blocks on a slow or dead peer. A tell that cannot be delivered is handed to
    ``on_error(name, msg, error)``; one that cannot be encoded is the message's fault, not the
    peer's: it is logged and dropped, and the peer stays reachable."""

    def __init__(
        self, name: str, client: Client, on_error: Callable[[str, object, PearlError], None]
    ) -> None:
        super().__init__(name, client)
        self.on_error = on_error
        self._q: queue.Queue[object] = queue.Queue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"courier {name}", daemon=True)
        self._thread.start()

    def tell(self, msg: object) -> None:
        self._q.put(msg)

    def _run(self) -> None:
        while (msg := self._q.get()) is not _CLOSE:
            if self._closed.is_set():
                continue  # the peer is being forgotten: drop what is left
            try:
                RemoteRef.tell(self, msg)
            except Unencodable as e:
                log.error("cannot send %s to %s, dropped: %s", type(msg).__name__, self.name, e)
            except PearlError as e:
                if not self._closed.is_set():
                    self.on_error(self.name, msg, e)
        self.client.close()

    def close(self) -> None:
        """Stop delivering; never waits for a peer (the thread finishes on its own)."""
        self._closed.set()
        self._q.put(_CLOSE)


_CLOSE = object()


def decode_value(value: object) -> object:
    """A wire mapping of a registered kind becomes its record; anything else passes through."""
    if isinstance(value, dict) and "kind" in value:
        reg = lookup(value["kind"])
        if reg is not None:
            return reg.decode(value)
    return value


def encode_value(value: object) -> object:
    return to_wire(value) if hasattr(value, "KIND") else value


class Directory:
    """Name -> ref, shared by the actors of one process."""

    def __init__(self, resolve: Callable[[str], Ref | None] | None = None) -> None:
        self._refs: dict[str, Ref] = {}
        self._lock = threading.Lock()
        # The ref of a name nobody registered (None: there is none); it keeps its own refs.
        self.resolve = resolve

    def register(self, ref: Ref) -> None:
        with self._lock:
            self._refs[ref.name] = ref

    def unregister(self, name: str, ref: Ref | None = None) -> None:
        with self._lock:
            if ref is None or self._refs.get(name) is ref:
                self._refs.pop(name, None)

    def get(self, name: str) -> Ref:
        ref = self.find(name)
        if ref is None:
            raise ActorUnavailable(f"no actor named {name!r}")
        return ref

    def find(self, name: str) -> Ref | None:
        with self._lock:
            ref = self._refs.get(name)
        if ref is None and self.resolve is not None:
            return self.resolve(name)
        return ref

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._refs)

    def refs(self) -> list[Ref]:
        """Every registered ref, by name."""
        with self._lock:
            return [self._refs[n] for n in sorted(self._refs)]

    def tell(self, name: str, msg: object) -> bool:
        """Best-effort tell; False when the actor is missing or gone."""
        ref = self.find(name)
        if ref is None:
            return False
        try:
            ref.tell(msg)
            return True
        except ActorUnavailable as e:
            # Stopped: pearld stops the orchestrator first at shutdown, and a late report to it
            # is dropped by design; a crash is reported by the actor's supervisor.
            log.debug("tell %s %s dropped: %s", name, type(msg).__name__, e)
            return False
        except PearlError as e:
            log.warning("tell %s %s failed: %s", name, type(msg).__name__, e)
            return False


def serve_directory(directory: Directory) -> Callable[[Envelope], Result]:
    """An rpc handler for ``call`` messages: deliver the message to a local actor."""

    def handle(env: Envelope) -> Result:
        call = env.msg
        if not isinstance(call, Call) or call.method not in ("tell", "ask"):
            raise PearlError(f"expected a call with method tell or ask, got {env.kind}")
        msg = decode_value(call.args.get("msg"))
        ref = directory.get(call.actor)
        if call.method == "tell":
            ref.tell(msg)
            return Result(value=None)
        return Result(value=encode_value(ref.ask(msg)))

    return handle


Handler = Callable[[Any, Any], Any]


class PearlActor(pykka.ThreadingActor):
    """Dispatch by message type: ``handles = {Type: method, ...}``, written in the class body
    after the methods it names. A message's class, or the nearest base in its MRO, picks the
    method; the actor's ``name`` is its address in the :class:`Directory`."""

    handles: ClassVar[dict[type, Handler]] = {}
    name: ClassVar[str] = "actor"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        for msg_type, handler in cls.handles.items():
            if not callable(handler):
                raise TypeError(
                    f"{cls.__name__}.handles[{msg_type.__name__}] must be a method, got {handler!r}"
                )

    def on_receive(self, message: object) -> object:
        for cls in type(message).__mro__:
            handler = self.handles.get(cls)
            if handler is not None:
                return handler(self, message)
        # A message this actor does not know is a bug elsewhere; it must not stop the actor.
        log.error("%s ignores a %s it does not handle", self.name, type(message).__name__)
        return None

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # The actor stops; pearld's supervision sees it dead and starts it again.
        log.error("actor %s failed: %s", self.name, exception_value)


def start(
    directory: Directory, cls: type[PearlActor], /, *args: object, **kwargs: object
) -> LocalRef:
    """Start an actor, register it under its name, and confirm it is alive (``kwargs`` are its
    constructor's; ``directory`` may be one of them)."""
    ref = LocalRef(cls.name, cls.start(*args, **kwargs))
    if not ref.ref.is_alive():
        raise ActorUnavailable(f"actor {cls.name} did not start")
    directory.register(ref)
    return ref


__all__ = [
    "ActorUnavailable",
    "AnswerFilter",
    "CourierRef",
    "Directory",
    "LocalRef",
    "PearlActor",
    "Ref",
    "RemoteRef",
    "decode_value",
    "encode_value",
    "serve_directory",
    "start",
]
