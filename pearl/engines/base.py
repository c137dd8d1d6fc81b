"""The one contract every inference engine implements (torch, sim, sglang, vllm).

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
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from pearl.core.errors import EngineError, KVTimeout, RequestRefused
from pearl.core.schema import Value
from pearl.core.state import Role
from pearl.engines.grammar import Grammar
from pearl.engines.lifecycle import EngineState, Lifecycle


class FinishReason(enum.StrEnum):
    STOP = "stop"  # a stop id was generated
    LENGTH = "length"  # max_new_tokens reached (or the context limit)
    ABORT = "abort"  # aborted: output_ids holds the tokens generated so far
    PREFILLED = "prefilled"  # prefill role: KV shipped, first token in output_ids


GREEDY_BELOW = 1e-5  # a temperature below this samples greedily (vLLM's _SAMPLING_EPS)


class SamplingParams(Value, frozen=True, kw_only=True):
    """How tokens are drawn, with vLLM's fields, defaults and semantics (vLLM's order: min_tokens
    and logit_bias, then the penalties, then greedy or temperature, min_p, top_k and top_p)."""

    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 (or below GREEDY_BELOW) means greedy
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_k: int = 0  # the k most likely tokens; 0 or -1: all
    min_p: float = 0.0  # drop tokens below min_p times the most likely one's probability
    presence_penalty: float = 0.0  # [-2, 2], subtracted once per token the output holds
    frequency_penalty: float = 0.0  # [-2, 2], subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # > 0: prompt and output tokens' logits / (or *) it
    min_tokens: int = 0  # the stop ids cannot be sampled before this many tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]) added
    grammar: Grammar | None = None  # structured outputs: the output follows it (grammar.py)

    @property
    def greedy(self) -> bool:
        """Argmax: a temperature below :data:`GREEDY_BELOW` (as vLLM's ``_SAMPLING_EPS``), so
        that logits / temperature stay finite."""
        return self.temperature < GREEDY_BELOW

    @property
    def plain(self) -> bool:
        """No field beyond temperature and top_p changes the distribution."""
        return (
            self.top_k in (0, -1) and not self.min_p and not self.presence_penalty
            and not self.frequency_penalty and self.repetition_penalty == 1.0
            and not self.min_tokens and not self.logit_bias
        )  # fmt: skip


class GenerateRequest(Value, frozen=True, kw_only=True):
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
    top_logprobs: int = 0  # alternatives returned per output token, most likely first (<= 20)
    # Samples of one request (n > 1): sequences of one group share their prompt's prefill on
    # one worker (one computes it, the others copy its K/V); the Router keeps them together.
    group: str = ""
    # A resumed request: the last ``generated`` ids of input_ids are output an earlier attempt
    # generated; penalties and min_tokens count them as output.
    generated: int = 0


class GenerateResult(Value, frozen=True, kw_only=True):
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
    # Per output token, the request's top_logprobs most likely (token id, logprob) pairs
    # (empty when not requested).
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()


class IterationStat(Value, frozen=True, kw_only=True):
    """One scheduler iteration: what the Runtime Tracker fits A, b and t_prefill from."""

    t_start: float  # engine clock (monotonic seconds)
    duration_s: float
    decode_batch: int  # sequences that produced a token in this iteration
    prefill_tokens: int  # prompt tokens computed in this iteration (chunked prefill)


class KVTransferStat(Value, frozen=True, kw_only=True):
    transfer_id: str
    bytes: int
    duration_s: float
    direction: str  # "send" | "recv"


class EngineTelemetry(Value, frozen=True, kw_only=True):
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


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # the seed range vLLM and the sim engine take


def _wire_text(value: str, what: str, rid: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestRefused(
            f"request {rid[:80]!r}: {what} is not valid text ({e.reason} at {e.start}); "
            "send UTF-8 without lone surrogates"
        ) from None


def _check_ids(ids: Sequence[int], what: str, rid: str, vocab_size: int) -> None:
    """Every id of ``ids`` in [0, vocab_size) (in [0, 2**63) where the vocabulary is unknown)."""
    if not ids:
        return
    limit = vocab_size or INT64_MAX + 1
    low, high = min(ids), max(ids)
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        where = f"the vocabulary of {vocab_size} tokens" if vocab_size else "[0, 2**63)"
        raise RequestRefused(
            f"request {rid}: {what} holds token id {bad}, outside {where}; "
            f"give ids in [0, {limit - 1}]"
        )


def check_request(req: GenerateRequest, max_seq_len: int = 0, vocab_size: int = 0) -> None:
    """Refuse a malformed request before it is queued (clear message, nothing changed):
    :class:`RequestRefused`, final for that request. ``max_seq_len`` is the context limit and
    ``vocab_size`` the model's vocabulary; 0 where unknown (the server checks them itself).

    Whatever passes can be encoded on the wire and computed by every engine: text is UTF-8,
    token ids are in [0, vocab_size), the seed is a signed 64-bit integer (vLLM's and the sim
    engine's range; torch's is wider), ``max_new_tokens`` is in [1, 2**63), temperature and
    top_p are finite."""
    sp = req.sampling
    _wire_text(req.rid, "the rid", req.rid)
    if not req.rid:
        raise RequestRefused("request has an empty rid")
    for what, text in (("trajectory", req.trajectory), ("transfer_id", req.transfer_id),
                       ("kv_peer", req.kv_peer)):  # fmt: skip
        _wire_text(text, what, req.rid)
    if not req.input_ids:
        raise RequestRefused(f"request {req.rid}: input_ids is empty; give at least one token")
    _check_ids(ids=req.input_ids, what="input_ids", rid=req.rid, vocab_size=vocab_size)
    _check_ids(ids=sp.stop_ids, what="stop_ids", rid=req.rid, vocab_size=vocab_size)
    if max_seq_len and len(req.input_ids) >= max_seq_len:
        raise RequestRefused(
            f"request {req.rid}: prompt of {len(req.input_ids)} tokens leaves no "
            f"room under the context limit of {max_seq_len}"
        )
    if not 1 <= sp.max_new_tokens <= INT64_MAX:
        raise RequestRefused(
            f"request {req.rid}: max_new_tokens must be in [1, 2**63), got {sp.max_new_tokens}"
        )
    if sp.seed is not None and not INT64_MIN <= sp.seed <= INT64_MAX:
        raise RequestRefused(
            f"request {req.rid}: seed {sp.seed} is outside [-2**63, 2**63); give a 64-bit seed"
        )
    if not (math.isfinite(sp.temperature) and sp.temperature >= 0 and 0 < sp.top_p <= 1):
        raise RequestRefused(
            f"request {req.rid}: need temperature >= 0 and 0 < top_p <= 1, got "
            f"{sp.temperature}, {sp.top_p}"
        )
    problem = sampling_problem(sp, vocab_size)
    if problem is None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
        problem = f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {req.top_logprobs}"
    if problem is None and not 0 <= req.generated < len(req.input_ids):
        problem = f"generated must be in [0, {len(req.input_ids)}), got {req.generated}"
    if problem is not None:
        raise RequestRefused(f"request {req.rid}: {problem}")


MAX_TOP_LOGPROBS = 20  # alternatives per token, as vLLM's default max_logprobs and OpenAI's


def sampling_problem(sp: SamplingParams, vocab_size: int = 0) -> str | None:
    """What is wrong with vLLM's sampling fields of ``sp`` (vLLM's ranges), or None."""
    finite = all(
        math.isfinite(x)
        for x in (sp.min_p, sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty)
    )
    if not finite:
        return "min_p and the penalties must be finite"
    if sp.top_k < -1:
        return f"top_k must be -1 or 0 (all tokens) or at least 1, got {sp.top_k}"
    if not 0 <= sp.min_p <= 1:
        return f"min_p must be in [0, 1], got {sp.min_p}"
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2 <= getattr(sp, name) <= 2:
            return f"{name} must be in [-2, 2], got {getattr(sp, name)}"
    if sp.repetition_penalty <= 0:
        return f"repetition_penalty must be > 0, got {sp.repetition_penalty}"
    if not 0 <= sp.min_tokens <= INT64_MAX:
        return f"min_tokens must be >= 0, got {sp.min_tokens}"
    limit = vocab_size or INT64_MAX + 1
    for token, bias in sp.logit_bias:
        if not 0 <= token < limit:
            return f"logit_bias names token id {token}, outside [0, {limit - 1}]"
        if not (math.isfinite(bias) and -100 <= bias <= 100):
            return f"logit_bias of token {token} must be in [-100, 100], got {bias}"
    return None


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
    vocab_size: int = 0  # token ids it can compute are below this; 0: unknown (its server checks)
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
        already, well formed for this model (:func:`check_request`: RequestRefused, final), with
        the hand-off fields its role needs)."""
        rid = request.rid
        self._need_serving("generate")
        why = self._life.refusal()
        if why:
            raise EngineError(f"{why}; route {rid} elsewhere")
        if rid in self._requests():
            raise EngineError(f"request {rid} is already in flight on this engine")
        check_request(request, max_seq_len, self.vocab_size)
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
    "MAX_TOP_LOGPROBS",
    "RequestRefused",
    "SamplingParams",
    "check_request",
    "sampling_problem",
]
