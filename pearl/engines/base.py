"""The one contract every inference engine implements (torch, sglang, sim).

A worker host owns exactly one engine. The engine runs its own scheduling loop (continuous
batching) and hands results back through ``concurrent.futures.Future`` objects, so the WorkerActor
stays a thin shell: it forwards commands and reports results.

Prefill-decode disaggregation follows SGLang's shape: the router sends the *same* request to a
prefill worker and to a decode worker with a shared ``transfer_id`` (SGLang's bootstrap room).
The prefill engine computes the KV cache and the first token and ships the KV to ``kv_peer``
through its :class:`KVChannel`; the decode engine waits for that transfer (with a timeout),
continues decoding, and its result is the request's result.
"""

from __future__ import annotations

import enum
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from pearl.core.errors import EngineError, KVTimeout
from pearl.core.schema import Value
from pearl.core.state import Role
from pearl.engines.lifecycle import EngineState, Lifecycle


class FinishReason(enum.StrEnum):
    STOP = "stop"  # a stop id was generated
    LENGTH = "length"  # max_new_tokens reached (or the context limit)
    ABORT = "abort"  # aborted: output_ids holds the tokens generated so far
    PREFILLED = "prefilled"  # prefill role: KV shipped, first token in output_ids


class SamplingParams(Value, frozen=True):
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()
    seed: int | None = None


class GenerateRequest(Value, frozen=True):
    rid: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams = SamplingParams()
    trajectory: str = ""  # turns of one trajectory share a prefix: keep its KV for the next turn
    return_logprobs: bool = True
    transfer_id: str = ""  # PD only: names this request's KV transfer prefill -> decode
    kv_peer: str = ""  # PD only, prefill side: address of the decode worker's KV inbox
    # The trajectory is on the rollout's critical path: its group is one the next batch (the one
    # the trainer waits for) still needs. The Router gives such turns the lent workers.
    critical: bool = False


class GenerateResult(Value, frozen=True):
    rid: str
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # one per output token (empty when not requested)
    finish_reason: FinishReason
    weights_version: int
    prompt_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV was reused instead of prefilled
    # Decode iterations that generated its tokens, and their batch sizes summed: the batch its
    # decode really shared (the Runtime Tracker's kappa); 0 where the engine does not say.
    decode_steps: int = 0
    decode_batch_sum: int = 0


class IterationStat(Value, frozen=True):
    """One scheduler iteration: what the Runtime Tracker fits A, b and t_prefill from."""

    t_start: float  # engine clock (monotonic seconds)
    duration_s: float
    decode_batch: int  # sequences that produced a token in this iteration
    prefill_tokens: int  # prompt tokens computed in this iteration (chunked prefill)


class KVTransferStat(Value, frozen=True):
    transfer_id: str
    bytes: int
    duration_s: float
    direction: str  # "send" | "recv"


class EngineTelemetry(Value, frozen=True):
    iterations: tuple[IterationStat, ...] = ()
    transfers: tuple[KVTransferStat, ...] = ()


class KVChannel(Protocol):
    """Moves KV caches peer to peer (zero-copy multipart frames), never through pearld."""

    address: str  # where peers send KV destined to this engine

    def send(
        self, peer: str, transfer_id: str, meta: dict[str, Any], frames: Sequence[Any]
    ) -> None:
        """Ship one request's KV to ``peer``; returns once the frames are handed to the socket."""

    def receive(self, transfer_id: str, timeout_s: float) -> tuple[dict[str, Any], list[Any]]:
        """The KV shipped under ``transfer_id``; raises KVTimeout when it does not arrive in time.

        The returned meta is what the sender passed plus ``sent_at`` and ``arrived_at`` (wall-clock
        seconds) added by the channel, from which the receiver measures the transfer.
        """

    def poll(self, transfer_id: str) -> tuple[dict[str, Any], list[Any]] | None:
        """``receive`` without waiting: the transfer if it has arrived, else None.

        An engine loop polls its pending transfers between iterations instead of blocking on one.
        """

    def close(self) -> None:
        """Release the inbox and the sockets. Idempotent."""


class Engine(ABC):
    """One inference engine. Methods are thread-safe; ``generate`` never blocks on the model."""

    kind: str = "abstract"

    @property
    @abstractmethod
    def role(self) -> Role: ...

    @property
    @abstractmethod
    def weights_version(self) -> int: ...

    @abstractmethod
    def start(self) -> None:
        """Build the model and allocate memory; afterwards the engine serves."""

    @abstractmethod
    def stop(self) -> None:
        """Abort everything in flight and free all resources. Idempotent."""

    @abstractmethod
    def generate(self, request: GenerateRequest) -> Future[GenerateResult]:
        """Queue a request; the future resolves when it finishes, is aborted, or fails."""

    @abstractmethod
    def abort(self, rid: str) -> None:
        """Abort one request; its future resolves with ABORT and the tokens generated so far."""

    def abort_all(self) -> None:
        """Abort every request in flight (shrink: keep the generated prefixes)."""
        for rid in self.in_flight():
            self.abort(rid)

    @abstractmethod
    def in_flight(self) -> list[str]:
        """Request ids queued or running."""

    @abstractmethod
    def drain(self, timeout_s: float) -> bool:
        """Stop admitting, wait for in-flight requests to finish; True when none is left."""

    @abstractmethod
    def release_memory(self) -> None:
        """Drop KV cache and weights from device memory, keep the process (borrow hand-back)."""

    @abstractmethod
    def resume_memory(self) -> None:
        """Re-allocate what release_memory dropped; weights come back at the same version."""

    @abstractmethod
    def load_weights(self, version: int, source: Any) -> None:
        """Load weights by version (a path or a state dict); an older version raises EngineError."""

    @abstractmethod
    def set_role(self, role: Role) -> None:
        """Switch role; the engine must be idle (drain first), else EngineError."""

    @abstractmethod
    def telemetry(self) -> EngineTelemetry:
        """Stats collected since the last call (and forget them)."""


def check_request(req: GenerateRequest, max_seq_len: int = 0) -> None:
    """Reject a malformed request before it is queued (clear message, nothing changed).
    ``max_seq_len`` is the context limit; 0 where the server checks it itself."""
    sp = req.sampling
    if not req.rid:
        raise EngineError("request has an empty rid")
    if not req.input_ids:
        raise EngineError(f"request {req.rid}: input_ids is empty; give at least one token")
    if max_seq_len and len(req.input_ids) >= max_seq_len:
        raise EngineError(
            f"request {req.rid}: prompt of {len(req.input_ids)} tokens leaves no "
            f"room under the context limit of {max_seq_len}"
        )
    if sp.max_new_tokens < 1:
        raise EngineError(
            f"request {req.rid}: max_new_tokens must be >= 1, got {sp.max_new_tokens}"
        )
    if sp.temperature < 0 or not 0 < sp.top_p <= 1:
        raise EngineError(
            f"request {req.rid}: need temperature >= 0 and 0 < top_p <= 1, got "
            f"{sp.temperature}, {sp.top_p}"
        )


class Drainable:
    """``in_flight`` and ``drain`` for engines that keep their requests in a mapping guarded by
    a condition variable (``_cv``, notified whenever a request finishes) and their state in a
    :class:`~pearl.engines.lifecycle.Lifecycle` (``_life``)."""

    _cv: threading.Condition
    _life: Lifecycle
    _drainers: int = 0

    def _requests(self) -> Mapping[str, Any]:
        raise EngineError(f"{type(self).__name__} does not track its requests")

    def in_flight(self) -> list[str]:
        with self._cv:
            return list(self._requests())

    def drain(self, timeout_s: float) -> bool:
        """Refuse new requests while waiting up to ``timeout_s`` for in-flight ones to end."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            if self._life.state is EngineState.SERVING:
                self._life.to(EngineState.DRAINING)
            self._drainers += 1
            try:
                while self._requests() and (left := deadline - time.monotonic()) > 0:
                    self._cv.wait(min(left, 0.5))
                return not self._requests()
            finally:
                self._drainers -= 1
                if not self._drainers and self._life.state is EngineState.DRAINING:
                    self._life.to(EngineState.SERVING)


SERVING_ROLES = (Role.COLOCATED, Role.PREFILL, Role.DECODE)


class EngineBase(Drainable, Engine):
    """What the serving engines share: role, weights version and lifecycle state as properties,
    the role check, and the checks a request passes before it is accepted.

    A subclass sets ``kind``, and in ``__init__`` ``kv_channel``, ``_role`` (after
    :meth:`_check_role`), ``_version``, ``_cv`` and ``_life``."""

    kind: str
    roles: tuple[Role, ...] = SERVING_ROLES  # the roles this engine can serve
    kv_channel: KVChannel | None
    _role: Role
    _version: int

    @property
    def role(self) -> Role:
        return self._role

    @property
    def weights_version(self) -> int:
        return self._version

    @property
    def released(self) -> bool:
        return self._life.released

    @property
    def state(self) -> EngineState:
        return self._life.state

    @property
    def accepting(self) -> bool:
        """Serving, and taking new requests now (not draining, releasing or relaunching)."""
        return self._life.state is EngineState.SERVING and not self._life.refusal()

    def _check_role(self, role: Role) -> None:
        if role not in self.roles:
            raise EngineError(
                f"an engine serves as one of {[r.value for r in self.roles]}, not {role}"
            )
        if role is not Role.COLOCATED and self.kv_channel is None:
            raise EngineError(f"role {role} moves KV caches: build the engine with a kv_channel")

    def _need_running(self, what: str) -> None:
        if not self._life.running:
            raise EngineError(f"{what}: the {self.kind} engine is not running (start() it)")

    def _need_serving(self, what: str) -> None:
        self._need_running(what)
        if self._life.released:
            raise EngineError(
                f"{what}: the {self.kind} engine released its memory; call "
                "resume_memory() before generating"
            )

    def _admit(self, request: GenerateRequest, max_seq_len: int = 0) -> None:
        """Under ``_cv``: raise unless this engine takes ``request`` now (serving, not in flight
        already, well formed, with the hand-off fields its role needs)."""
        rid = request.rid
        self._need_serving("generate")
        why = self._life.refusal()
        if why:
            raise EngineError(f"{why}; route {rid} elsewhere")
        if rid in self._requests():
            raise EngineError(f"request {rid} is already in flight on this engine")
        check_request(request, max_seq_len)
        if self._role is Role.PREFILL and not (request.transfer_id and request.kv_peer):
            raise EngineError(
                f"prefill engine: request {rid} needs transfer_id and "
                "kv_peer (the decode worker's KV inbox)"
            )
        if self._role is Role.DECODE and not request.transfer_id:
            raise EngineError(
                f"decode engine: request {rid} needs the transfer_id "
                "its prefill worker ships the KV under"
            )


__all__ = [
    "SERVING_ROLES",
    "Drainable",
    "Engine",
    "EngineBase",
    "EngineError",
    "EngineTelemetry",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "IterationStat",
    "KVChannel",
    "KVTimeout",
    "KVTransferStat",
    "SamplingParams",
    "check_request",
]
