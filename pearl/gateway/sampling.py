"""vLLM's sampling fields, ``n`` samples and top logprobs: read from a request, checked, and
turned into the jobs of one request.

- The sampling fields (``top_k``, ``min_p``, ``presence_penalty``, ``frequency_penalty``,
  ``repetition_penalty``, ``min_tokens``, ``logit_bias``) take vLLM's ranges and defaults; a value
  out of range is a 400 naming the field. The torch and sim engines honour them; an engine that
  cannot (:data:`HONOURS`) gets a 400 naming the engine, unless every field has its no-op value.
- ``n`` samples of one prompt are ``n`` jobs of one group (``Sampling.group``): the pool sends
  them to one worker, which prefills the prompt once. With a ``seed``, sample ``i`` uses
  ``seed + i`` (wrapped to a signed 64-bit integer), so ``n=8, seed=s`` gives the samples that
  eight requests with seeds ``s .. s+7`` give.
- Top logprobs (chat ``top_logprobs``, completions ``logprobs``, ``/generate``'s
  ``top_logprobs_num``) are at most :data:`MAX_TOP_LOGPROBS`, the model's raw distribution
  (vLLM's default ``logprobs_mode``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pearl.engines.base import MAX_TOP_LOGPROBS, SamplingParams, sampling_problem
from pearl.gateway.context import Context
from pearl.gateway.errors import refuse
from pearl.gateway.jobs import Job

MAX_N = 128  # samples of one request
KNOBS = (
    "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "min_tokens", "logit_bias",
)  # fmt: skip
# The engines that honour the sampling fields and top logprobs (the gateway's 400 names others).
HONOURS = frozenset({"torch", "sim", "vllm", ""})
INT64 = 1 << 64


def knobs(ctx: Context, req: Any, where: str = "") -> dict[str, Any]:
    """The vLLM sampling fields ``req`` gives (``where``: their object's path in an error),
    checked: a dict of :class:`~pearl.gateway.backend.Sampling`'s fields."""
    out: dict[str, Any] = {}
    for name in KNOBS:
        value = getattr(req, name, None)
        if value is None and req.model_extra:
            value = req.model_extra.get(name)
        if value is None:
            continue
        out[name] = value
    if "top_k" in out and out["top_k"] == -1:
        out["top_k"] = 0
    if "logit_bias" in out:
        out["logit_bias"] = _bias(out["logit_bias"], where + "logit_bias")
    for name in KNOBS:
        if name in out and name != "logit_bias":
            kind = int if name in ("top_k", "min_tokens") else float
            if isinstance(out[name], bool) or not isinstance(out[name], int | float):
                raise refuse(f"{name} must be a number, got {out[name]!r}", where + name)
            if kind is int and out[name] != int(out[name]):
                raise refuse(f"{name} must be an integer, got {out[name]!r}", where + name)
            out[name] = kind(out[name])
    try:
        params = SamplingParams(**out)
    except TypeError as e:
        raise refuse(str(e), where or None) from None
    problem = sampling_problem(params, ctx.backend.vocab_size)
    if problem is not None:
        field = next((n for n in KNOBS if problem.startswith(n)), None)
        raise refuse(problem, where + field if field else None)
    if not params.plain:
        engine = str(getattr(ctx.backend, "engine", ""))
        if engine not in HONOURS:
            used = [n for n in KNOBS if n in out]
            raise refuse(
                f"the {engine} engine of this pool does not apply vLLM's sampling fields "
                f"({', '.join(used)}); serve with the torch, sim or vllm engine",
                where + used[0],
            )
    return out


def _bias(value: Any, param: str) -> tuple[tuple[int, float], ...]:
    """``{"token id": bias}`` as (id, bias) pairs; a key that is not an id is a 400."""
    if not isinstance(value, dict):
        raise refuse('logit_bias maps token ids to biases: {"123": 5.0}', param)
    pairs = []
    for k, v in value.items():
        try:
            token = int(k)
        except (TypeError, ValueError):
            raise refuse(f"logit_bias key {k!r} is not a token id", param) from None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise refuse(f"logit_bias of {k!r} must be a number, got {v!r}", param)
        pairs.append((token, max(-100.0, min(100.0, float(v)))))  # vLLM clamps
    return tuple(pairs)


def top_count(ctx: Context, k: int | None, param: str) -> int:
    """Alternatives per token the request asks for, checked (0 to MAX_TOP_LOGPROBS)."""
    if not k:
        return 0
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise refuse(f"{param} must be in [0, {MAX_TOP_LOGPROBS}], got {k}", param)
    engine = str(getattr(ctx.backend, "engine", ""))
    if engine not in HONOURS:
        raise refuse(f"the {engine} engine of this pool does not return top logprobs", param)
    return k


def count(n: int | None, param: str = "n") -> int:
    """Samples the request asks for (1 to MAX_N)."""
    n = 1 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise refuse(f"{param} must be an integer in [1, {MAX_N}], got {n!r}", param)
    return n


def seed_of(seed: int | None, i: int) -> int | None:
    """Sample ``i``'s seed: ``seed + i`` wrapped to a signed 64-bit integer."""
    if seed is None:
        return None
    return (seed + i + INT64 // 2) % INT64 - INT64 // 2


def samples(j: Job, n: int) -> list[Job]:
    """``n`` jobs of ``j``'s prompt, one group: sample ``i`` has rid ``{rid}/{i}`` and seed
    :func:`seed_of` (``j`` itself when ``n`` is 1)."""
    if n == 1:
        return [j]
    return [
        dataclasses.replace(
            j,
            rid=f"{j.rid}/{i}",
            sampling=dataclasses.replace(j.sampling, seed=seed_of(j.sampling.seed, i), group=j.rid),
        )
        for i in range(n)
    ]


__all__ = ["HONOURS", "KNOBS", "MAX_N", "count", "knobs", "samples", "seed_of", "top_count"]
