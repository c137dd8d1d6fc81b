"""A :data:`~pearl.rl.rollout.GenerateFn` over the gateway's ``POST /generate``: tokens in and out.

Every turn of a trajectory is one ``/generate`` request with the whole token sequence so far, the
trajectory's id as its session (``X-Session-ID``: its turns go to the worker that holds its
prefix) and ``return_logprob``. The gateway's contract makes elasticity invisible here: a turn
whose worker is reclaimed or returned to training continues elsewhere from its prefix, and the
answer holds every generated id with the logprob of the weights version that sampled it.

A turn records one weights version (:class:`~pearl.rl.trajectory.Turn`): a request whose tokens
span versions (a new version was loaded mid-turn) records its first token's, the oldest, so
that a staleness check on the trajectory never under-states its age.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from pearl.core.errors import PearlError
from pearl.engines.base import FinishReason, GenerateResult, SamplingParams

RETRY_STATUSES = frozenset({429, 503})  # the gateway's transient refusals (Retry-After)


class GatewayRequestError(PearlError):
    """The gateway refused a turn or gave up on it (its status and message)."""


class GatewayGenerate:
    """A GenerateFn over ``base_url``'s ``/generate`` (``http://HOST:PORT``; a ``/v1`` suffix is
    dropped). A 429 or 503 is retried after its ``Retry-After``, at most ``retries`` times; any
    other error raises :class:`GatewayRequestError`. Create, call and :meth:`aclose` it in one
    event loop. ``migrations`` counts the times a turn moved to another worker mid-generation
    (the gateway's ``meta_info.migrations``)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        retries: int = 20,
        prefix: str = "trl",
    ) -> None:
        import httpx

        root = base_url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(base_url=root, headers=headers, timeout=timeout_s)
        self.retries, self.prefix = retries, prefix
        self._ids = itertools.count()
        self.migrations = 0

    async def __call__(
        self, ids: tuple[int, ...], sampling: SamplingParams, trajectory_id: str
    ) -> GenerateResult:
        rid = f"{self.prefix}-{next(self._ids)}"
        body = {
            "input_ids": list(ids),
            "rid": rid,
            "return_logprob": True,
            "sampling_params": {
                "max_new_tokens": sampling.max_new_tokens,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "seed": sampling.seed,
                "stop_token_ids": list(sampling.stop_ids),
            },
        }
        headers = {"X-Session-ID": trajectory_id}
        for attempt in range(self.retries + 1):
            r = await self.client.post("/generate", json=body, headers=headers)
            if r.status_code in RETRY_STATUSES and attempt < self.retries:
                await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
                continue
            if r.status_code != 200:
                raise GatewayRequestError(
                    f"/generate for {trajectory_id} answered {r.status_code}: {r.text[:300]}"
                )
            answer = r.json()
            self.migrations += int(answer["meta_info"].get("migrations", 0))
            return result_of(rid, answer, len(ids))
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.client.aclose()


def result_of(rid: str, answer: dict[str, Any], prompt_tokens: int) -> GenerateResult:
    """The engine result one ``/generate`` answer describes."""
    meta = answer["meta_info"]
    out = tuple(int(i) for i in answer["output_ids"])
    logprobs = tuple(float(lp[0]) for lp in (meta.get("output_token_logprobs") or ()))
    if len(logprobs) != len(out):
        raise GatewayRequestError(
            f"/generate answered {len(out)} ids and {len(logprobs)} logprobs for {rid}"
        )
    versions = meta.get("weight_versions") or [[0, meta.get("weight_version", 0)]]
    finish = (meta.get("finish_reason") or {}).get("type", "stop")
    return GenerateResult(
        rid=rid,
        output_ids=out,
        logprobs=logprobs,
        finish_reason=FinishReason.LENGTH if finish == "length" else FinishReason.STOP,
        weights_version=int(min(v for _, v in versions)),
        prompt_tokens=int(meta.get("prompt_tokens", prompt_tokens)),
    )


__all__ = ["GatewayGenerate", "GatewayRequestError", "result_of"]
