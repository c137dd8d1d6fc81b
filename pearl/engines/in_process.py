"""The serving loop in-process engines share: continuous batching, roles, PD, memory, telemetry.

:class:`InProcessEngine` implements the :class:`~pearl.engines.base.Engine` contract once. It runs
one scheduler thread that, every iteration, takes new requests and aborts, polls the KV channel,
admits queued sequences while KV pages last, and hands one batch of :class:`Segment` s (one decode
token per running sequence, then chunked prefill up to the token budget) to the backend's
``_forward``. Backends (the torch model, the sim cost model) only compute: K/V into pages and one
sampled token per finished segment. Everything that changes engine state runs on that thread, so
the public methods are thread-safe by construction. One request's fault fails that request alone:
a failed step is run again sequence by sequence, and a sequence that fails alone fails its request
while the others go on. The loop itself never dies of a fault: an iteration that raises fails the
requests in flight (they resume elsewhere) and the next iteration runs.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from pearl.core.errors import RequestRefused
from pearl.core.state import Role
from pearl.engines.base import (
    EngineBase,
    EngineError,
    EngineTelemetry,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    IterationStat,
    KVChannel,
    KVTransferStat,
)
from pearl.engines.blocks import KVBlocks
from pearl.engines.grammar import Constrained, GrammarBook
from pearl.engines.handoff import KVHandoff
from pearl.engines.lifecycle import EngineState, Lifecycle
from pearl.engines.model_backend import ModelBackend, ServingConfig
from pearl.engines.scheduler import Scheduler
from pearl.engines.sequence import Phase, Sample, Segment, Seq
from pearl.tokenizer import ByteTokenizer

log = logging.getLogger(__name__)
T = TypeVar("T")


class InProcessEngine(EngineBase, ModelBackend):
    """The shared engine; subclasses supply the model (``_forward`` and the memory hooks)."""

    def __init__(self, config: ServingConfig, role: Role, kv_channel: KVChannel | None) -> None:
        self.cfg = config
        self._role = role
        self.kv_channel = kv_channel
        self._check_role(role)
        self._version = 0
        self._cv = threading.Condition()
        self._seqs: dict[str, Seq] = {}  # everything in flight, by rid
        self._inbox: list[Seq] = []
        self._aborts: list[str] = []
        self._calls: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._iters: deque[IterationStat] = deque(maxlen=config.telemetry_cap)
        self._xfers: deque[KVTransferStat] = deque(maxlen=config.telemetry_cap)
        self._thread: threading.Thread | None = None
        self._life = Lifecycle(self.kind)
        self._pending_weights: tuple[int, Any] | None = None
        self._paused = False  # pause_generation(): no iteration runs
        self.handoff = (
            KVHandoff(
                channel=kv_channel,
                timeout_s=config.kv_timeout_s,
                record=self._record_transfer,
                now=self._now,
            )
            if kv_channel is not None
            else None
        )
        self.sched: Scheduler | None = None  # None while released
        self._grammars: GrammarBook | None = None  # structured outputs: built on first use
        self.max_seq_len = 0

    # -- the contract --------------------------------------------------------------------------

    def start(self) -> None:
        if self._life.state is not EngineState.NEW:
            raise EngineError(f"{self.kind} engine was already started; build a new one")
        self._backend_start()
        limit = self._context_limit()
        self.max_seq_len = min(limit, self.cfg.max_seq_len) if self.cfg.max_seq_len else limit
        self._make_pool()
        self._thread = threading.Thread(target=self._loop, name=f"{self.kind}-engine", daemon=True)
        with self._cv:
            self._life.to(EngineState.SERVING)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            if self._life.stopping:
                return
            holds_device = self._life.state is not EngineState.RELEASED
            self._life.to(EngineState.STOPPING)
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._cv:
            self._life.to(EngineState.STOPPED)
        if holds_device and self.sched is not None:
            self._free_device()
        self.sched = None

    def generate(self, request: GenerateRequest) -> Future[GenerateResult]:
        fut: Future[GenerateResult] = Future()
        with self._cv:
            self._admit(request, self.max_seq_len)
            seq = Seq(request, fut, list(request.input_ids))
            self._seqs[request.rid] = seq
            self._inbox.append(seq)
            self._cv.notify_all()
        return fut

    def abort(self, rid: str) -> None:
        with self._cv:
            self._aborts.append(rid)
            self._cv.notify_all()

    def pause_generation(self) -> None:
        """Run no iteration until :meth:`continue_generation`: requests stay in flight where they
        are; new requests, aborts and calls are still taken (SGLang's /pause_generation)."""
        with self._cv:
            self._paused = True
            self._cv.notify_all()

    def continue_generation(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    def _requests(self) -> dict[str, Seq]:
        return self._seqs

    def release_memory(self) -> None:
        """Abort what is in flight (prefixes kept in the results), then free weights and KV."""

        def release() -> None:
            if self._life.released:
                return
            for seq in self._in_flight_seqs():
                self._finish(seq, FinishReason.ABORT)
            self._free_device()
            self.sched = None
            with self._cv:
                self._life.to(EngineState.RELEASED)

        self._call(release)

    def resume_memory(self) -> None:
        def resume() -> None:
            if not self._life.released:
                return
            self._restore_device()
            self._make_pool()
            with self._cv:
                self._life.to(EngineState.DRAINING if self._drainers else EngineState.SERVING)
            if self._pending_weights is not None:
                version, source = self._pending_weights
                self._pending_weights = None
                self._load(version, source)

        self._call(resume)

    def load_weights(self, version: int, source: Any) -> None:
        def load() -> None:
            if version < self._version:
                raise EngineError(
                    f"weights version {version} is older than the loaded version "
                    f"{self._version}; refusing to go back"
                )
            if self._life.released:  # applied by resume_memory (lazy propagation)
                self._pending_weights = (version, source)
            else:
                self._load(version, source)
                assert self.sched is not None
                self.sched.blocks.clear_prefixes()  # resident K/V was computed with the old weights
            self._version = version

        self._call(load)

    def set_role(self, role: Role) -> None:
        self._check_role(role)

        def switch() -> None:
            if self._seqs:
                raise EngineError(
                    f"set_role({role}) needs an idle engine; {len(self._seqs)} "
                    "requests are in flight: drain or abort them first"
                )
            self._role = role

        self._call(switch)

    def telemetry(self) -> EngineTelemetry:
        with self._cv:
            out = EngineTelemetry(iterations=tuple(self._iters), transfers=tuple(self._xfers))
            self._iters.clear()
            self._xfers.clear()
        return out

    def kv_usage(self) -> dict[str, int]:
        """Pages of the KV pool: total, free, held by resident prefixes, and evictions so far."""
        with self._cv:
            if self.sched is None:
                return {
                    "pages": 0,
                    "free": 0,
                    "cached": 0,
                    "evictions": 0,
                    "preemptions": 0,
                    "bytes_per_page": 0,
                }
            b = self.sched.blocks
            return {
                "pages": b.n_pages,
                "free": b.free_pages,
                "cached": b.cached_pages,
                "evictions": b.evictions,
                "preemptions": self.sched.preemptions,
                "bytes_per_page": b.bytes_per_page,
            }

    # -- helpers for the public side -----------------------------------------------------------

    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread between iterations and return its result."""
        fut: Future[T] = Future()
        what = getattr(fn, "__name__", "call")
        with self._cv:
            self._need_running(what)
            self._calls.append((fn, fut))
            self._cv.notify_all()
        try:
            return fut.result(self.cfg.call_timeout_s)
        except FutureTimeout:
            raise EngineError(
                f"{what}: the {self.kind} engine thread did not run it within "
                f"{self.cfg.call_timeout_s:g} s (ServingConfig.call_timeout_s); is a forward "
                "step hung?"
            ) from None

    def _make_pool(self) -> None:
        blocks = KVBlocks(self.cfg.kv_budget_bytes, self._bytes_per_token(), self.cfg.page_size)
        self._allocate_kv(blocks.n_pages)
        self.sched = Scheduler(
            blocks, self.cfg.token_budget, self.cfg.max_running, copy_kv=self._copy_kv
        )

    def _in_flight_seqs(self) -> list[Seq]:
        with self._cv:
            return list(self._seqs.values())

    def _record_transfer(self, stat: KVTransferStat) -> None:
        with self._cv:
            self._xfers.append(stat)

    # -- the scheduler thread ------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                paused = self._paused
                busy = self.sched is not None and self.sched.busy and not paused
                stopping = self._life.state is EngineState.STOPPING
                urgent = busy or self._inbox or self._aborts or self._calls or stopping
                if not urgent:  # only KV transfers pending: poll the channel briskly
                    self._cv.wait(0.001 if self.handoff and self.handoff.waiting else 0.5)
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
                calls, self._calls = self._calls, []
                stopping = self._life.state is EngineState.STOPPING
            if not busy:
                self._after_idle()
            for fn, fut in calls:
                try:
                    fut.set_result(fn())
                except BaseException as e:  # the caller gets it; the loop goes on
                    fut.set_exception(e)
            if stopping:
                for seq in self._in_flight_seqs():
                    self._finish(seq, FinishReason.ABORT)
                return
            try:
                self._iterate(inbox, aborts, paused)
            except Exception as e:  # a fault of the loop itself: nothing in flight may hang
                log.exception("%s engine: an iteration failed; failing the requests in flight",
                              self.kind)  # fmt: skip
                for seq in self._in_flight_seqs():
                    self._fail(seq, EngineError(f"engine step failed: {type(e).__name__}: {e}"))

    def _iterate(self, inbox: list[Seq], aborts: list[str], paused: bool) -> None:
        for seq in inbox:
            self._accept(seq)
        for rid in aborts:
            if (victim := self._seqs.get(rid)) is not None:
                self._finish(victim, FinishReason.ABORT)
        if self.sched is not None and not paused:
            self._poll_transfers(self.sched)
            self._step(self.sched)

    def _step(self, sched: Scheduler) -> None:
        """One iteration: admit, plan, run the backend, commit, finish what is done."""
        for seq, err in sched.admit(self._import_arrived):
            self._fail(seq, err)
        segments = sched.plan()
        while sched.out_of_memory:
            self._finish(sched.out_of_memory.pop(), FinishReason.LENGTH)
        if not segments:
            return
        t0 = self._now()
        try:
            samples = self._forward(segments)
        except Exception as e:  # find the sequences at fault; the others go on
            log.warning("%s engine: a batch of %d failed (%s: %s); isolating the failing "
                        "sequences", self.kind, len(segments), type(e).__name__, e)  # fmt: skip
            segments, samples = self._isolate(segments)
            if not segments:
                return
        decoding = [g.seq for g in segments if g.seq.phase is Phase.DECODE]
        decode = len(decoding)
        prefill = sum(g.end - g.start for g in segments if g.seq.phase is not Phase.DECODE)
        with self._cv:
            self._iters.append(
                IterationStat(
                    t_start=t0,
                    duration_s=self._now() - t0,
                    decode_batch=decode,
                    prefill_tokens=prefill,
                )
            )
        for seq in decoding:
            seq.decode_steps += 1
            seq.decode_batch_sum += decode
        for seq in sched.commit(segments, samples):
            if self._role is Role.PREFILL:
                self._ship(seq)
                continue
            self._end_if_done(seq)

    def _end_if_done(self, seq: Seq) -> bool:
        """End ``seq`` when its last token ends it; True when it ended. A sequence whose output
        left its grammar fails alone."""
        try:
            reason = seq.stop_reason(self.max_seq_len)
        except RequestRefused as e:
            self._fail(seq, e)
            return True
        if reason is not None:
            self._finish(seq, reason)
        return reason is not None

    def _isolate(self, segments: list[Segment]) -> tuple[list[Segment], list[Sample]]:
        """After a failed batch: run each sequence's segment alone (its K/V is written again, the
        same values); one that still fails fails its request alone. Returns the segments that
        ran and their samples, in order."""
        kept: list[Segment] = []
        samples: list[Sample] = []
        for g in segments:
            try:
                out = self._forward([g])
            except Exception as e:
                log.warning("%s engine: request %s fails its model step: %s: %s",
                            self.kind, g.seq.rid, type(e).__name__, e)  # fmt: skip
                self._fail(g.seq, EngineError(f"model step failed: {type(e).__name__}: {e}"))
                continue
            kept.append(g)
            samples.extend(out)
        return kept, samples

    def _accept(self, seq: Seq) -> None:
        if seq.future.done():
            return
        try:
            self._new_sequence(seq)
            seq.grammar = self._constrain(seq.req)
        except RequestRefused as e:  # a grammar that does not compile: final, not retried
            self._fail(seq, e)
            return
        except Exception as e:  # the request's own fault (a seed its backend refuses)
            self._fail(seq, EngineError(f"request {seq.rid}: {type(e).__name__}: {e}"))
            return
        if self._role is Role.DECODE:
            assert self.handoff is not None
            self.handoff.expect(seq)
        else:
            assert self.sched is not None
            self.sched.enqueue(seq)

    def _constrain(self, req: GenerateRequest) -> Constrained | None:
        """The matcher of a request under a grammar (structured outputs), advanced over the
        output an earlier attempt kept (its last ``generated`` prompt ids); else None."""
        g = req.sampling.grammar
        if g is None:
            return None
        if self._grammars is None:
            tok = getattr(self, "tokenizer", None) or ByteTokenizer()
            self._grammars = GrammarBook(tok, int(getattr(self, "vocab_size", tok.vocab_size)))
        kept = req.input_ids[len(req.input_ids) - req.generated :] if req.generated else ()
        return self._grammars.start(g, kept)

    def _ship(self, seq: Seq) -> None:
        """Prefill role: the first token is sampled, the K/V goes to the decode worker."""
        assert self.handoff is not None
        try:
            self.handoff.ship(seq, self._export_kv, self._version)
        except EngineError as e:
            self._fail(seq, e)
            return
        self._finish(seq, FinishReason.PREFILLED)

    def _poll_transfers(self, sched: Scheduler) -> None:
        if self.handoff is None or not self.handoff.waiting:
            return
        arrived, failed = self.handoff.poll()
        for seq, err in failed:
            self._fail(seq, err)
        for seq in arrived:
            if not self._end_if_done(seq):  # the first token may already end it
                sched.enqueue(seq)

    def _import_arrived(self, seq: Seq) -> None:
        assert seq.kv is not None
        meta, frames = seq.kv
        seq.computed = len(seq.tokens) - 1
        self._import_kv(seq, meta, frames)

    # -- ending a request ----------------------------------------------------------------------

    def _finish(self, seq: Seq, reason: FinishReason) -> None:
        """Resolve a sequence with its output so far; its pages go back or stay as a prefix."""
        self._detach(seq)
        self._resolve(seq, result=seq.result(reason, self._version))

    def _fail(self, seq: Seq, error: BaseException) -> None:
        self._detach(seq)
        self._resolve(seq, error=error)

    def _detach(self, seq: Seq) -> None:
        if self.handoff is not None:
            self.handoff.forget(seq)
        seq.kv = None
        if self.sched is not None:
            self.sched.drop(seq, keep_prefix=self._role is not Role.DECODE)

    def _resolve(
        self, seq: Seq, result: GenerateResult | None = None, error: BaseException | None = None
    ) -> None:
        with self._cv:
            self._seqs.pop(seq.rid, None)
            self._cv.notify_all()
        if seq.future.done():
            return
        if error is not None:
            seq.future.set_exception(error)
        else:
            seq.future.set_result(result)  # type: ignore[arg-type]


__all__ = ["ServingConfig", "InProcessEngine"]
