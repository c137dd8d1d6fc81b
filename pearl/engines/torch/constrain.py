"""Structured outputs in the torch engine's sampler: the grammar's mask on the logits.

The mask is a separate step before sampling (:func:`masked`): the tokens a request's grammar does
not allow next get ``-inf``, so every sampler (greedy, temperature, top-p, vLLM's fields) draws
among allowed tokens only. The logprobs returned stay the model's raw ones (:func:`raw`), as vLLM
returns by default (``raw_logprobs``): what an RL trainer recomputes knows no grammar.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pearl.engines.grammar import left
from pearl.engines.sequence import Sample, Seq

_SHIFTS = torch.arange(32, dtype=torch.int32)


def masked(logits: torch.Tensor, seqs: Sequence[Seq], max_seq_len: int) -> torch.Tensor | None:
    """``logits`` [n, vocab] with the disallowed tokens of constrained rows at -inf (a copy);
    None when no row is constrained. llguidance writes each row's bitmask into one int32 block
    for the batch; it is unpacked and applied with one ``masked_fill`` on the device."""
    rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
    if not rows:
        return None
    words = np.empty((len(rows), seqs[rows[0]].grammar.words), dtype=np.int32)
    for j, i in enumerate(rows):
        seqs[i].grammar.fill(seqs[i].output, left(seqs[i], max_seq_len), words[j])
    bits = torch.from_numpy(words).to(logits.device)
    ok = ((bits[:, :, None] >> _SHIFTS.to(logits.device)) & 1).reshape(len(rows), -1) != 0
    width = min(ok.shape[1], logits.shape[1])
    out = logits.clone()
    if len(rows) == len(seqs):  # every row constrained: in place, no gather
        out[:, :width].masked_fill_(~ok[:, :width], float("-inf"))
        out[:, width:] = float("-inf")
        return out
    idx = torch.tensor(rows, device=out.device)
    block = out[idx]
    block[:, :width].masked_fill_(~ok[:, :width], float("-inf"))
    block[:, width:] = float("-inf")
    out[idx] = block
    return out


def raw(logits: torch.Tensor, samples: list[Sample], seqs: Sequence[Seq]) -> list[Sample]:
    """``samples`` with each constrained row's logprob and top alternatives from the raw
    ``logits`` (the engine passes the raw logits to :func:`~pearl.engines.torch.sampling.sample`
    instead, batched; this is the per-row form)."""
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
