"""SGLang's HTTP dialect as plain data: payloads, versions, endpoint names, metrics. No I/O.

One module for both sides: the client (:mod:`pearl.engines.sglang.client`) builds request bodies
and reads answers with it, the torch engine's facade (:mod:`pearl.engines.facade`) reads
requests and builds answers with it, so one dialect is spoken by both (the tests check the payloads
against literal JSON, so a mistake here cannot hide behind the symmetry).

Facts it encodes (SGLang's ``http_server.py`` and ``io_struct.py``):

- ``/generate`` takes ``rid``, ``input_ids``, ``sampling_params`` (``max_new_tokens``,
  ``temperature``, ``top_p``, ``stop_token_ids``, ``sampling_seed``), ``return_logprob`` and, under
  PD, ``bootstrap_host``/``bootstrap_port``/``bootstrap_room`` (a random 63-bit room; the same body
  goes to the prefill and the decode server). The answer has ``output_ids`` and ``meta_info`` with
  ``finish_reason.type`` in ``length | stop | abort``, ``prompt_tokens``, ``completion_tokens``,
  ``cached_tokens``, ``weight_version`` and, with logprobs, ``output_token_logprobs`` as
  ``[logprob, token_id, text]`` triples. An aborted request still returns its output so far.
- ``/server_info`` and ``/model_info`` replaced ``/get_server_info`` and ``/get_model_info``
  (deprecated aliases, later removed); ``/pd_role_switch {new_role}`` exists from 0.5.21 when the
  server runs with ``--enable-pd-role-switch`` and in PD mode.
- SGLang's ``/abort_request`` matches request ids by prefix, so PEARL sends every rid with a
  terminator (:func:`wire_rid`): aborting ``r1`` must not abort ``r10``.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from pearl.core.state import Role
from pearl.engines.base import EngineError, FinishReason, GenerateRequest, GenerateResult
from pearl.engines.base import SamplingParams as Sampling
from pearl.engines.web import parse_metrics

ROLE_SWITCH_SINCE = (0, 5, 21)  # /pd_role_switch and --enable-pd-role-switch
MODES = {Role.COLOCATED: "null", Role.PREFILL: "prefill", Role.DECODE: "decode"}
ROLES = {mode: role for role, mode in MODES.items()}
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
RID_END = "$"


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.5.21rc1"`` -> ``(0, 5, 21)``; unparsable parts count as 0."""
    nums = [int(m) for m in re.findall(r"\d+", text.split("+")[0])[:3]]
    while len(nums) < 3:
        nums.append(0)
    return nums[0], nums[1], nums[2]


def supports_role_switch(version: str) -> bool:
    return parse_version(version) >= ROLE_SWITCH_SINCE


@dataclass(frozen=True)
class Endpoints:
    """The paths of one server generation (probed: ``/server_info`` first, then the old name)."""

    server_info: str = "/server_info"
    model_info: str = "/model_info"

    @classmethod
    def legacy(cls) -> Endpoints:
        return cls("/get_server_info", "/get_model_info")


def wire_rid(rid: str) -> str:
    """The rid PEARL sends: terminated, so SGLang's prefix-matching abort hits only this one."""
    return rid + RID_END


def plain_rid(wire: str) -> str:
    return wire[: -len(RID_END)] if wire.endswith(RID_END) else wire


@dataclass(frozen=True)
class Bootstrap:
    """Where a PD request's KV is brokered: the prefill server's bootstrap endpoint and a room."""

    host: str
    port: int
    room: int

    @classmethod
    def fresh(cls, host: str, port: int) -> Bootstrap:
        return cls(host, port, new_room())

    def fields(self) -> dict[str, Any]:
        return {
            "bootstrap_host": self.host,
            "bootstrap_port": self.port,
            "bootstrap_room": self.room,
        }


def new_room() -> int:
    """A random 63-bit bootstrap room (SGLang's router draws them the same way)."""
    return secrets.randbits(63)


def generate_body(req: GenerateRequest, bootstrap: Bootstrap | None = None) -> dict[str, Any]:
    """The ``/generate`` body of one request (token ids in, token ids out, never streamed)."""
    s = req.sampling
    sampling: dict[str, Any] = {
        "max_new_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
    }
    if s.stop_ids:
        sampling["stop_token_ids"] = list(s.stop_ids)
    if s.seed is not None:
        sampling["sampling_seed"] = s.seed
    body: dict[str, Any] = {
        "rid": wire_rid(req.rid),
        "input_ids": list(req.input_ids),
        "sampling_params": sampling,
        "return_logprob": req.return_logprobs,
        "stream": False,
    }
    if bootstrap is not None:
        body.update(bootstrap.fields())
    return body


def request_of(body: dict[str, Any]) -> tuple[GenerateRequest, Bootstrap | None]:
    """Inverse of :func:`generate_body` (the facade's side); raises EngineError on bad input."""
    try:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise TypeError("input_ids must be a list of ints")
        sp = dict(body.get("sampling_params") or {})
        seed = sp.get("sampling_seed")
        sampling = Sampling(
            max_new_tokens=int(sp.get("max_new_tokens", 128)),
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            stop_ids=tuple(int(t) for t in sp.get("stop_token_ids") or ()),
            seed=None if seed is None else int(seed),
        )
        rid = str(body.get("rid") or f"req-{secrets.token_hex(6)}")
        req = GenerateRequest(
            rid=rid,
            input_ids=tuple(ids),
            sampling=sampling,
            return_logprobs=bool(body.get("return_logprob", False)),
        )
        boot = None
        if body.get("bootstrap_room") is not None:
            boot = Bootstrap(
                str(body.get("bootstrap_host") or "127.0.0.1"),
                int(body["bootstrap_port"]),
                int(body["bootstrap_room"]),
            )
    except (KeyError, TypeError, ValueError) as e:
        raise EngineError(f"bad /generate body: {type(e).__name__}: {e}") from None
    return req, boot


def finish_of(reason: FinishReason, n_out: int, message: str = "") -> dict[str, Any]:
    """SGLang's ``finish_reason`` object for a PEARL finish reason."""
    if reason is FinishReason.ABORT:
        return {"type": "abort", "message": message or "aborted"}
    if reason is FinishReason.STOP:
        return {"type": "stop", "matched": None}
    return {"type": "length", "length": n_out}


def response_body(result: GenerateResult, version: str, e2e_s: float = 0.0) -> dict[str, Any]:
    """The ``/generate`` answer for one finished request (the facade's side)."""
    meta: dict[str, Any] = {
        "id": result.rid,
        "finish_reason": finish_of(result.finish_reason, len(result.output_ids)),
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.output_ids),
        "cached_tokens": result.cached_tokens,
        "weight_version": version,
        "e2e_latency": e2e_s,
    }
    if result.logprobs:
        meta["output_token_logprobs"] = [
            [lp, tok, None] for lp, tok in zip(result.logprobs, result.output_ids, strict=True)
        ]
    return {"text": "", "output_ids": list(result.output_ids), "meta_info": meta}


def result_of(rid: str, body: dict[str, Any], role: Role, version: int) -> GenerateResult:
    """A :class:`GenerateResult` from a ``/generate`` answer; ``version`` when it names none."""
    meta = body.get("meta_info") or {}
    out = tuple(int(t) for t in body.get("output_ids") or ())
    fr = meta.get("finish_reason") or {}
    kind = fr.get("type") if isinstance(fr, dict) else str(fr)
    if kind == "abort":
        reason = FinishReason.ABORT
    elif role is Role.PREFILL:
        reason = FinishReason.PREFILLED
    else:
        reason = FinishReason.STOP if kind == "stop" else FinishReason.LENGTH
    lps = meta.get("output_token_logprobs") or ()
    logprobs = tuple(float(x[0]) for x in lps)[: len(out)]
    wv = str(meta.get("weight_version", ""))
    return GenerateResult(
        rid=rid,
        output_ids=out,
        logprobs=logprobs,
        finish_reason=reason,
        weights_version=int(wv) if wv.isdigit() else version,
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        cached_tokens=int(meta.get("cached_tokens", 0)),
    )


def render_metrics(values: dict[str, float], labels: str = "") -> str:
    """{name: value} -> Prometheus text (the facade's ``/metrics``)."""
    lab = f"{{{labels}}}" if labels else ""
    return "".join(f"{name}{lab} {value}\n" for name, value in sorted(values.items()))


__all__ = [
    "MEMORY_TAGS",
    "MODES",
    "RID_END",
    "ROLES",
    "ROLE_SWITCH_SINCE",
    "Bootstrap",
    "Endpoints",
    "finish_of",
    "generate_body",
    "new_room",
    "parse_metrics",
    "parse_version",
    "plain_rid",
    "render_metrics",
    "request_of",
    "response_body",
    "result_of",
    "supports_role_switch",
    "wire_rid",
]
