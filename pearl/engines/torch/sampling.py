"""Token sampling: greedy at temperature 0, else temperature + top-p with a per-request generator.

Logprobs are those of the sampled token under the model's distribution (temperature 1, no top-p),
the quantity an RL trainer compares against its own recomputation.
"""

from __future__ import annotations

import os

import torch

from pearl.engines.base import SamplingParams


def generator_for(params: SamplingParams) -> torch.Generator | None:
    """A CPU generator seeded from ``params.seed`` (or fresh entropy); None for greedy."""
    if params.temperature == 0:
        return None
    g = torch.Generator(device="cpu")
    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
    g.manual_seed(seed)
    return g


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[tuple[int, float]]:
    """One (token, logprob) per row of ``logits`` [n, vocab]."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    hot = [i for i, p in enumerate(params) if p.temperature > 0]
    if hot:
        cpu = logits[hot].cpu()
        for row, i in enumerate(hot):
            tokens[i] = _sample_row(cpu[row], params[i], generators[i])
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
    return list(zip(tokens.tolist(), chosen.tolist(), strict=True))


def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    probs = torch.softmax(logits / p.temperature, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        sorted_p[mass_before >= p.top_p] = 0.0  # keeps the smallest set reaching top_p (>= 1 token)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=gen).item())


__all__ = ["generator_for", "sample"]
