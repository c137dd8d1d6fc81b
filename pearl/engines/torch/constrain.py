"""Structured outputs in the torch engine's sampler: the grammar's mask on the logits.

The mask is a separate step before sampling (:func:`masked`): the tokens a request's grammar does
not allow next get ``-inf``, so every sampler (greedy, temperature, top-p, vLLM's fields) draws
among allowed tokens only. The logprobs returned stay the model's raw ones (:func:`raw`), as vLLM
returns by default (``raw_logprobs``): what an RL trainer recomputes knows no grammar.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pearl.engines.grammar import masks
from pearl.engines.sequence import Sample, Seq


def masked(logits: torch.Tensor, seqs: Sequence[Seq], max_seq_len: int) -> torch.Tensor | None:
    """``logits`` [n, vocab] with the disallowed tokens of constrained rows at -inf (a copy);
    None when no row is constrained."""
    found = masks(seqs, max_seq_len)
    if found is None:
        return None
    rows, ok = found
    out = logits.clone()
    allowed = torch.from_numpy(ok).to(out.device)
    idx = torch.tensor(rows, device=out.device)
    width = min(allowed.shape[1], out.shape[1])
    block = out[idx]
    block[:, :width].masked_fill_(~allowed[:, :width], float("-inf"))
    block[:, width:] = float("-inf")
    out[idx] = block
    return out


def raw(logits: torch.Tensor, samples: list[Sample], seqs: Sequence[Seq]) -> list[Sample]:
    """``samples`` with each constrained row's logprob and top alternatives from the raw
    ``logits``."""
    out = list(samples)
    for i, s in enumerate(seqs):
        if s.grammar is None:
            continue
        lp = torch.log_softmax(logits[i].float(), dim=-1)
        k = s.req.top_logprobs
        top: tuple[tuple[int, float], ...] = ()
        if k:
            v, t = torch.topk(lp, k)
            top = tuple(zip(t.tolist(), v.tolist(), strict=True))
        tok = out[i].token
        out[i] = Sample(tok, float(lp[tok]), top)
    return out


__all__ = ["masked", "raw"]
