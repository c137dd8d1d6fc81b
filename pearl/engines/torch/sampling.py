"""Token sampling with vLLM's sampling fields and order, and a per-request generator.

For each row: min_tokens (the stop ids masked until that many tokens) and logit_bias, then the
repetition, frequency and presence penalties, then greedy (argmax) at a temperature below
``GREEDY_BELOW``, else temperature, min_p, top_k and top_p, and a draw from the request's
generator — the order of vLLM's v1 sampler.

Logprobs, the sampled token's and the top alternatives', are the model's raw distribution
(temperature 1, before any of the above): vLLM's default ``logprobs_mode="raw_logprobs"``, and the
quantity an RL trainer compares against its own recomputation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pearl.engines.base import SamplingParams
from pearl.engines.sequence import Sample


@dataclass(frozen=True)
class Row:
    """One sequence to sample for: its parameters, generator, history and the alternatives it
    wants (``top``)."""

    params: SamplingParams
    generator: torch.Generator | None = None
    prompt: Sequence[int] = ()  # the prompt's ids (repetition_penalty)
    output: Sequence[int] = ()  # the ids generated so far (penalties, min_tokens)
    top: int = 0


def generator_for(params: SamplingParams) -> torch.Generator | None:
    """A CPU generator seeded from ``params.seed`` (or fresh entropy); None for greedy."""
    if params.greedy:
        return None
    g = torch.Generator(device="cpu")
    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
    g.manual_seed(seed)
    return g


def sample(
    logits: torch.Tensor, rows: Sequence[Row], raw: torch.Tensor | None = None
) -> list[Sample]:
    """One :class:`Sample` per row of ``logits`` [n, vocab]. The logprobs come from ``raw``
    when given (the model's logits before a grammar's mask), else from ``logits``."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits if raw is None else raw.float(), dim=-1)
    adjusted = [i for i, r in enumerate(rows) if not r.params.plain]
    if adjusted:
        logits = logits.clone()
        for i in adjusted:
            adjust(logits[i], rows[i])
    tokens = torch.argmax(logits, dim=-1)
    hot = [i for i, r in enumerate(rows) if not r.params.greedy]
    if hot:
        cpu = logits[hot].cpu()
        for row, i in enumerate(hot):
            tokens[i] = _sample_row(cpu[row], rows[i].params, rows[i].generator)
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
    tops = top_logprobs(logprobs, [r.top for r in rows])
    return [Sample(t, lp, top) for t, lp, top in zip(tokens.tolist(), chosen, tops, strict=True)]


def top_logprobs(logprobs: torch.Tensor, ks: Sequence[int]) -> list[tuple[tuple[int, float], ...]]:
    """The ``ks[i]`` most likely (token id, logprob) pairs of each row, most likely first."""
    k = min(max(ks, default=0), logprobs.shape[-1])
    if k <= 0:
        return [() for _ in ks]
    values, ids = torch.topk(logprobs, k, dim=-1)
    vs, ix = values.tolist(), ids.tolist()
    return [tuple(zip(ix[i][:n], vs[i][:n], strict=True)) for i, n in enumerate(ks)]


def adjust(logits: torch.Tensor, row: Row) -> None:
    """vLLM's logits processing before greedy or temperature, in place on one row [vocab]:
    min_tokens, logit_bias, then the repetition, frequency and presence penalties."""
    p = row.params
    if p.min_tokens and len(row.output) < p.min_tokens and p.stop_ids:
        logits[list(p.stop_ids)] = float("-inf")
    if p.logit_bias:
        ids = torch.tensor([t for t, _ in p.logit_bias], device=logits.device)
        logits.index_add_(0, ids, torch.tensor([b for _, b in p.logit_bias], device=logits.device))
    if p.repetition_penalty != 1.0 and (row.prompt or row.output):
        seen = torch.tensor(sorted({*row.prompt, *row.output}), device=logits.device)
        v = logits[seen]
        logits[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and row.output:
        ids, counts = torch.tensor(list(row.output), device=logits.device).unique(
            return_counts=True
        )
        logits[ids] -= p.frequency_penalty * counts.float() + p.presence_penalty


def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    probs = torch.softmax(logits / p.temperature, dim=-1)
    if p.min_p > 0:
        probs[probs < p.min_p * probs.max()] = 0.0
    if 0 < p.top_k < probs.shape[-1]:
        kth = torch.topk(probs, p.top_k).values[-1]
        probs[probs < kth] = 0.0
    if p.top_p < 1.0:
        probs = probs / probs.sum()
        sorted_p, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        sorted_p[mass_before >= p.top_p] = 0.0  # keeps the smallest set reaching top_p (>= 1 token)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=gen).item())


__all__ = ["Row", "adjust", "generator_for", "sample", "top_logprobs"]
