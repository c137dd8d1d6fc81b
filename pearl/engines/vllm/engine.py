"""The ``vllm`` engine: the engine contract mapped onto one supervised vLLM server.

``VLLMEngine(VLLMEngineConfig(server=VLLMSpec(model_path=...)))`` launches the server at
``start()`` (or attaches to ``config.url``), waits for ``/health``, and then (launch, watch,
relaunch, stop and pending weights are :class:`~pearl.engines.server.ServerEngine`'s; this
module speaks vLLM's dialect):

- ``generate`` streams ``/v1/completions`` with the prompt's token ids, greedy or sampled as the
  request says, every stop left to the request's stop ids (``ignore_eos``), and reads the
  sampled token ids and their logprobs as they come;
- ``abort`` closes the request's stream: vLLM aborts a request whose client left, and the
  result keeps the tokens read so far (``FinishReason.ABORT``), so the turn resumes elsewhere
  with its prefix. A server that dies or fails mid-request also yields its prefix (perhaps
  empty): the request is not at fault, and resumes on the relaunched server or elsewhere. A
  request the server refuses (4xx) fails with :class:`RequestRefused`: final, never retried;
- ``release_memory`` aborts what is in flight (prefixes kept), then puts the server to sleep
  (CUDA, ``--enable-sleep-mode``: device memory freed, weights kept in host memory) or pauses
  it (CPUs, where vLLM has no sleep mode: the process stays, nothing is scheduled);
  ``resume_memory`` undoes it and applies weights published meanwhile;
- ``load_weights`` loads a published safetensors snapshot in place through PEARL's worker
  extension (``/collective_rpc``), drops the prefix cache computed with the old weights, and
  sets vLLM's own weight version; never a restart per version;
- ``telemetry`` turns ``/metrics`` deltas into iteration stats.

vLLM pools serve colocated only: PEARL's prefill-decode hand-off needs a KV connector that runs
on this platform (see docs/vllm.md).
"""

from __future__ import annotations

import functools
import json
import logging
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pearl.core.errors import RequestRefused
from pearl.core.state import Role
from pearl.engines.base import EngineError, FinishReason, GenerateRequest, GenerateResult
from pearl.engines.grammar import Grammar, llguidance_text
from pearl.engines.server import Call, ServerEngine, ServerEngineConfig
from pearl.engines.server_metrics import MetricNames
from pearl.engines.vllm.client import Completion, VLLMClient
from pearl.engines.vllm.launch import (
    GENERATED_ARG,
    GRAMMAR_ARG,
    SERVED_NAME,
    VLLMSpec,
    launch_command,
    launch_env,
)

log = logging.getLogger(__name__)

METRICS = MetricNames(
    itl=("vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds"),
    ttft="vllm:time_to_first_token_seconds",
    queue="vllm:request_queue_time_seconds",
    running="vllm:num_requests_running",
    prompt_tokens="vllm:prompt_tokens_total",
)
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


@dataclass(frozen=True)
class VLLMEngineConfig(ServerEngineConfig[VLLMSpec]):
    """How the vLLM engine runs its server (:class:`ServerEngineConfig`)."""


@dataclass
class _Call(Call):
    completion: Completion | None = None  # the request's stream, once open


class VLLMEngine(ServerEngine[_Call]):
    kind = "vllm"
    server_name = "vLLM"
    metric_names = METRICS
    # The server runs in a process group of its own: its engine core and workers go with it.
    process_group = True
    roles = (Role.COLOCATED,)
    cfg: VLLMEngineConfig
    spec: VLLMSpec
    client: VLLMClient

    # -- the server ----------------------------------------------------------------------------

    def _spec_for(self, server: VLLMSpec, role: Role) -> VLLMSpec:
        return server

    def _client_for(self, url: str) -> VLLMClient:
        return VLLMClient(url)

    def _command(self) -> list[str]:
        return launch_command(self.spec)

    def _env(self) -> dict[str, str] | None:
        return launch_env(self.spec)

    # -- requests ------------------------------------------------------------------------------

    def _new_call(self) -> _Call:
        return _Call(Future())

    def _run(self, req: GenerateRequest, call: _Call, role: Role) -> GenerateResult:
        # A server PEARL launched has its grammar processor; one it attached to may not.
        sent = body(req, grammar_processor=not self.cfg.url)
        completion = self.client.completion(sent, self.cfg.request_timeout_s)
        with self._cv:
            call.completion = completion
            aborted = call.aborted
        if aborted:
            completion.cancel()
        try:
            out = completion.run()
        except RequestRefused:
            raise
        except EngineError as e:  # the server died or failed: its prefix lives on
            out = completion.out
            log.warning("vLLM server lost %s after %d tokens: %s", req.rid, len(out.token_ids), e)
            call.aborted = True
        n = len(out.token_ids)
        if call.aborted or out.finish_reason is None:
            finish = FinishReason.ABORT
        else:
            finish = _FINISH.get(out.finish_reason, FinishReason.STOP)
        return GenerateResult(
            rid=req.rid,
            output_ids=tuple(out.token_ids),
            logprobs=tuple(out.logprobs[:n]) if req.return_logprobs else (),
            top_logprobs=tuple(t[: req.top_logprobs] for t in out.top[:n])
            if req.top_logprobs
            else (),
            finish_reason=finish,
            weights_version=self._version,
            prompt_tokens=len(req.input_ids),
            cached_tokens=out.cached_tokens,
        )

    def _abort_once(self, rid: str, call: _Call) -> None:
        """Close the request's stream: vLLM aborts a request whose client left."""
        with self._cv:
            completion = call.completion
        if completion is not None:
            completion.cancel()

    # -- memory, weights, roles ----------------------------------------------------------------

    def _rest(self) -> None:
        if self.spec.sleep_mode:
            self.client.sleep(1)
        else:
            self.client.pause()

    def _wake(self) -> None:
        if self.spec.sleep_mode:
            self.client.wake_up()
        else:
            self.client.resume()

    def _checked_weights(self, source: Any) -> str:
        return _snapshot(source)

    def _apply_weights(self, version: int, source: str) -> None:
        self.client.collective_rpc("pearl_load_weights", source)
        self.client.reset_prefix_cache()  # its KV was computed with the old weights
        self.client.update_weight_version(version)
        self._weights = source

    def set_role(self, role: Role) -> None:
        self._check_role(role)

    def _check_role(self, role: Role) -> None:
        check_role(role)


def check_role(role: Role) -> None:
    if role is not Role.COLOCATED:
        raise EngineError(
            f"a vLLM worker serves colocated only, not {role}: PEARL has no prefill-decode "
            "hand-off through a vLLM KV connector on this platform (docs/vllm.md); set "
            "daemon.pd = 'colocated' for vLLM pools"
        )


def body(req: GenerateRequest, grammar_processor: bool = True) -> dict[str, Any]:
    """The ``/v1/completions`` body of one request: token ids in, token ids and the sampled
    tokens' logprobs out; only the request's own stop ids end it before its length. vLLM's
    sampling fields and top logprobs (as ``token_id:N``, mapped back by the client) pass
    through in vLLM's own names.

    A constraint goes to PEARL's logits processor (``grammar_processor``, on every server PEARL
    launches: :func:`grammar_args`), which decodes under the in-process engines' own llguidance
    grammar from the state the kept prefix leaves; else (a server PEARL attached to) in vLLM's
    ``structured_outputs`` (:func:`structured`), where a resumed request's grammar starts again
    after its prefix.

    A resumed request (``generated`` > 0) keeps its min_tokens count; vLLM cannot be told that
    the kept prefix is output, so its penalties count only what this attempt generates
    (docs/gateway.md)."""
    s = req.sampling
    out: dict[str, Any] = {
        "model": SERVED_NAME,
        "prompt": list(req.input_ids),
        "max_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "ignore_eos": True,
        "stop_token_ids": list(s.stop_ids),
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stream_options": {"include_usage": True},
    }
    if req.return_logprobs or req.top_logprobs:
        out["logprobs"] = req.top_logprobs  # 0: the sampled token's own logprob only
    if req.top_logprobs:
        out["return_tokens_as_token_ids"] = True  # alternatives keyed by id, not text
    if s.seed is not None:
        out["seed"] = s.seed
    if not s.plain:
        out |= {
            "top_k": s.top_k or -1,
            "min_p": s.min_p,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "repetition_penalty": s.repetition_penalty,
            "min_tokens": max(0, s.min_tokens - req.generated),
            "logit_bias": {str(t): b for t, b in s.logit_bias},
        }
    if s.grammar is not None and grammar_processor:
        out["vllm_xargs"] = grammar_args(s.grammar, req.generated)
    elif s.grammar is not None:
        out["structured_outputs"] = structured(s.grammar)
    return out


def grammar_args(g: Grammar, generated: int) -> dict[str, Any]:
    """``g`` for PEARL's logits processor (``vllm_xargs``): the llguidance grammar the
    in-process engines compile (compact JSON), and how many trailing prompt ids are output an
    earlier attempt generated (the matcher consumes them first)."""
    return {GRAMMAR_ARG: _llguidance_text(g), GENERATED_ARG: generated}


_llguidance_text = functools.lru_cache(maxsize=256)(llguidance_text)


def structured(g: Grammar) -> dict[str, Any]:
    """``g`` as vLLM's ``structured_outputs`` (``json``, ``regex``, ``choice``, ``grammar``).
    JSON asks to be compact (``disable_any_whitespace``), as the in-process engines decode it.
    vLLM 0.32 accepts that request field but reads only the server's own setting
    (``--structured-outputs-config '{"disable_any_whitespace": true}'``): a server PEARL
    attaches to needs it, or a wandering model may pad JSON with whitespace (docs/vllm.md)."""
    if g.kind == "json":
        return {"json": json.loads(g.text), "disable_any_whitespace": True}
    if g.kind == "choice":
        return {"choice": json.loads(g.text)}
    return {g.kind: g.text}


def _snapshot(source: Any) -> str:
    """A published snapshot: a ``.safetensors`` file or a directory of them."""
    if not isinstance(source, str | Path):
        raise EngineError(
            f"vllm engine: weights come as a safetensors file or directory, not "
            f"{type(source).__name__}"
        )
    path = Path(source)
    if not path.exists():
        raise EngineError(f"vllm engine: no weights at {path}")
    return str(path.resolve())


__all__ = [
    "METRICS",
    "VLLMEngine",
    "VLLMEngineConfig",
    "body",
    "check_role",
    "grammar_args",
    "structured",
]
