"""The ``sim`` engine: the serving loop of the real engines, with a cost model instead of a model.

Every iteration takes ``A + b*decode_batch + t_prefill*prefill_tokens`` model seconds (the
quantities of eq. 1-3), memory operations take their measured costs, and the engine sleeps that
long times ``time_scale`` (0.001 runs 1000x faster than real). Telemetry is stamped in model
seconds, so a Runtime Tracker fits back the cost model's own A, b and t_prefill.

Tokens are a deterministic function of (weights version, prompt, position[, seed]): greedy output
is reproducible, a weight update changes it, and prefill -> decode gives the colocated tokens.
A request that uses vLLM's sampling fields (top_k, min_p, the penalties, min_tokens, logit_bias)
or asks for top logprobs draws from an explicit distribution instead (:mod:`pearl.engines.
sim_sampling`): ``CANDIDATES`` tokens with logits, a function of (version, prompt, position),
processed in vLLM's order and drawn with the request's seed.
The KV transfer carries meta only (tiny frames); its simulated size and time follow the cost model.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from dataclasses import dataclass, fields, replace
from typing import Any

from pearl.core.state import Role
from pearl.engines.base import EngineError, KVChannel
from pearl.engines.grammar import restrict
from pearl.engines.in_process import InProcessEngine, ServingConfig
from pearl.engines.sequence import Phase, Sample, Segment, Seq
from pearl.engines.sim_sampling import draw


@dataclass(frozen=True)
class SimCost:
    """What one rollout worker costs, in seconds. Defaults: a Qwen3-8B-class model on TP2 H800s.

    :meth:`from_roofline` fills one from ``pearl.core.catalog.roofline`` for any model and GPU.
    """

    A: float = 0.012  # fixed time of one decode iteration (weight reads, launches)
    b: float = 3.0e-4  # extra time per sequence in the decode batch (its KV reads)
    t_prefill: float = 2.0e-5  # time per prefill token
    kv_bytes_per_token: int = 147_456  # 36 layers * 8 KV heads * 128 dims * (K, V) * 2 bytes
    kv_bandwidth: float = 25e9  # bytes/s between prefill and decode workers
    start_s: float = 60.0  # cold start: process, model load, warm-up
    activation_s: float = 6.26  # resume_memory (paper Table 3)
    release_s: float = 3.18  # release_memory (paper Table 3)
    load_s: float = 5.0  # load_weights of one snapshot
    context_limit: int = 32_768
    vocab_size: int = 151_936

    @classmethod
    def from_roofline(cls, roof: Any, **overrides: Any) -> SimCost:
        """A, b, t_prefill, K and BW of a ``pearl.core.catalog.Roofline``; give the engine its
        ``H_max`` as ``kv_budget_bytes``."""
        return cls(
            **{
                "A": roof.A,
                "b": roof.b,
                "t_prefill": roof.t_prefill,
                "kv_bytes_per_token": int(roof.K),
                "kv_bandwidth": roof.BW,
                **overrides,
            }
        )

    def iteration_s(self, decode_batch: int, prefill_tokens: int) -> float:
        """Model seconds of one iteration."""
        return self.A + self.b * decode_batch + self.t_prefill * prefill_tokens

    def transfer_s(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.kv_bandwidth


@dataclass(frozen=True)
class SimEngineConfig(ServingConfig):
    kv_budget_bytes: int = 60 << 30  # HBM left for KV on a worker
    token_budget: int = 8192
    time_scale: float = 0.001  # wall seconds per model second


class SimEngine(InProcessEngine):
    """``SimEngine(cost=SimCost(), role=Role.COLOCATED, kv_channel=None, time_scale=0.001, ...)``"""

    kind = "sim"

    def __init__(
        self,
        config: SimEngineConfig | None = None,
        *,
        cost: SimCost | None = None,
        role: Role = Role.COLOCATED,
        kv_channel: KVChannel | None = None,
        **overrides: Any,
    ) -> None:
        known = {f.name for f in fields(SimEngineConfig)}
        if bad := sorted(set(overrides) - known):
            raise EngineError(f"unknown SimEngine option(s) {bad}; known: {sorted(known)}")
        cfg = replace(config or SimEngineConfig(), **overrides)
        super().__init__(cfg, role, kv_channel)
        self.sim_cfg = cfg
        self.cost = cost or SimCost()
        self.vocab_size = self.cost.vocab_size
        self._model_t = 0.0  # model-seconds clock
        self._wall0 = time.monotonic()

    # -- the clock: model seconds, advanced by the cost model, slept at time_scale ------------

    def _now(self) -> float:
        return self._model_t

    def _after_idle(self) -> None:
        """Model time passes while idle too; never run ahead of the wall clock."""
        wall = (time.monotonic() - self._wall0) / self.sim_cfg.time_scale
        self._model_t = max(self._model_t, wall)

    def _spend(self, model_s: float) -> None:
        self._model_t += model_s
        delay = self._wall0 + self._model_t * self.sim_cfg.time_scale - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    # -- backend -------------------------------------------------------------------------------

    def _bytes_per_token(self) -> int:
        return self.cost.kv_bytes_per_token

    def _context_limit(self) -> int:
        return self.cost.context_limit

    def _backend_start(self) -> None:
        self._wall0 = time.monotonic()
        self._spend(self.cost.start_s)

    def _allocate_kv(self, n_pages: int) -> None:
        """Pages are only counted."""

    def _new_sequence(self, seq: Seq) -> None:
        sp = seq.req.sampling
        if sp.greedy:
            seed = b""  # greedy: a function of (version, prompt, position) only
        elif sp.seed is not None:
            seed = struct.pack("<q", sp.seed)
        else:
            seed = os.urandom(8)
        prompt = struct.pack(f"<{len(seq.req.input_ids)}q", *seq.req.input_ids)
        seq.state = hashlib.blake2b(prompt + seed, digest_size=16).digest()
        if not (sp.plain and not seq.req.top_logprobs):  # the distribution: prompt, no seed
            seq.state = (seq.state, hashlib.blake2b(prompt, digest_size=16).digest())

    def _token(self, seq: Seq, position: int) -> Sample:
        if isinstance(seq.state, tuple):
            drawn, model = seq.state
            where = struct.pack("<qq", self._version, position)
            return draw(
                drawn=drawn + where, model=model + where, seq=seq, vocab=self.cost.vocab_size
            )
        h = hashlib.blake2b(
            seq.state + struct.pack("<qq", self._version, position), digest_size=16
        ).digest()
        tok = int.from_bytes(h[:8], "little") % self.cost.vocab_size
        logprob = -(int.from_bytes(h[8:12], "little") % 4000) / 1000.0 - 1e-3
        return Sample(tok, logprob)

    def _forward(self, segments: list[Segment]) -> list[Sample]:
        decode = sum(1 for g in segments if g.seq.phase is Phase.DECODE)
        prefill = sum(g.end - g.start for g in segments) - decode
        self._spend(self.cost.iteration_s(decode, prefill))
        seqs = [g.seq for g in segments if g.samples]
        return restrict([self._token(s, len(s.output)) for s in seqs], seqs, self.max_seq_len)

    def _copy_kv(self, source: Seq, target: Seq, n: int) -> None:
        """Nothing to copy: pages are only counted."""

    def _export_kv(self, seq: Seq) -> tuple[dict[str, Any], list[Any]]:
        took = self.cost.transfer_s(seq.computed)
        self._spend(took)  # eq. 3: the transfer sits on the prefill path
        return {"kv_bytes": seq.computed * self.cost.kv_bytes_per_token, "transfer_s": took}, []

    def _import_kv(self, seq: Seq, meta: dict[str, Any], frames: list[Any]) -> None:
        """Nothing to copy: the pages were counted at admission."""

    def _free_device(self) -> None:
        self._spend(self.cost.release_s)

    def _restore_device(self) -> None:
        self._spend(self.cost.activation_s)

    def _load(self, version: int, source: Any) -> None:
        self._spend(self.cost.load_s)


__all__ = ["SimCost", "SimEngine", "SimEngineConfig"]
