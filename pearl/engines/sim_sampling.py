"""The sim engine's explicit next-token distribution, for requests that use vLLM's sampling
fields or ask for top logprobs.

At each position the "model" puts its mass on ``CANDIDATES`` tokens with logits in [-8, 0], a
function of (weights version, prompt, position); a token named by ``logit_bias`` that is not among
them joins with a logit ``OUTSIDE`` below the least likely one. Raw logprobs (what is returned,
vLLM's default ``raw_logprobs``) are the log-softmax of those logits. Sampling processes them in
vLLM's order (min_tokens, logit_bias, repetition / frequency / presence penalties, then greedy or
temperature, min_p, top_k, top_p) and draws with a uniform number from the request's seed.
Pure Python: the sim runs without a tensor library's cost.
"""

from __future__ import annotations

import hashlib
import math

from pearl.engines.base import SamplingParams
from pearl.engines.sequence import Sample, Seq

CANDIDATES = 24  # tokens with mass at each position (top_logprobs asks for at most 20)
OUTSIDE = 20.0  # a biased token from outside the candidates starts this far below them


def distribution(model: bytes, vocab: int) -> dict[int, float]:
    """Candidate token -> raw logit at the position ``model`` hashes."""
    h = hashlib.shake_128(model).digest(CANDIDATES * 6)
    out: dict[int, float] = {}
    for i in range(CANDIDATES):
        tok = int.from_bytes(h[6 * i : 6 * i + 4], "little") % vocab
        out.setdefault(tok, -8.0 * int.from_bytes(h[6 * i + 4 : 6 * i + 6], "little") / 65535)
    return out


def _log_softmax(logits: dict[int, float]) -> dict[int, float]:
    top = max(logits.values())
    z = top + math.log(sum(math.exp(v - top) for v in logits.values()))
    return {t: v - z for t, v in logits.items()}


def draw(drawn: bytes, model: bytes, seq: Seq, vocab: int) -> Sample:
    """The token for ``seq`` at this position: ``model`` hashes the distribution, ``drawn`` the
    uniform number of a random draw."""
    sp = seq.req.sampling
    logits = distribution(model, vocab)
    floor = min(logits.values()) - OUTSIDE
    for tok, _ in sp.logit_bias:
        logits.setdefault(tok, floor)
    raw = _log_softmax(logits)
    x = dict(logits)
    if sp.min_tokens and seq.generated < sp.min_tokens:
        for t in sp.stop_ids:
            if t in x:
                x[t] = -math.inf
    for tok, bias in sp.logit_bias:
        x[tok] += bias
    prompt, output = seq.history()
    if sp.repetition_penalty != 1.0:
        for t in {*prompt, *output} & x.keys():
            x[t] = x[t] / sp.repetition_penalty if x[t] > 0 else x[t] * sp.repetition_penalty
    if sp.frequency_penalty or sp.presence_penalty:
        counts: dict[int, int] = {}
        for t in output:
            if t in x:
                counts[t] = counts.get(t, 0) + 1
        for t, c in counts.items():
            x[t] -= sp.frequency_penalty * c + sp.presence_penalty
    tok = max(x, key=lambda t: (x[t], -t)) if sp.greedy else _random(x, sp, drawn)
    top = sorted(raw.items(), key=lambda kv: (-kv[1], kv[0]))[: seq.req.top_logprobs]
    return Sample(tok, raw[tok], tuple(top))


def _random(x: dict[int, float], sp: SamplingParams, drawn: bytes) -> int:
    top = max(x.values())
    probs = {t: math.exp((v - top) / sp.temperature) for t, v in x.items() if v > -math.inf}
    most = max(probs.values())
    min_p, top_k, top_p = sp.min_p, sp.top_k, sp.top_p
    order = sorted(probs, key=lambda t: (-probs[t], t))
    if min_p > 0:
        order = [t for t in order if probs[t] >= min_p * most]
    if top_k > 0:
        order = order[:top_k]
    total = sum(probs[t] for t in order)
    if top_p < 1.0:
        kept, mass = [], 0.0
        for t in order:
            if mass >= top_p * total:
                break
            kept.append(t)
            mass += probs[t]
        order = kept
    total = sum(probs[t] for t in order)
    u = int.from_bytes(hashlib.blake2b(drawn, digest_size=8).digest(), "little") / 2.0**64
    acc = 0.0
    for t in order:
        acc += probs[t] / total
        if u < acc:
            return t
    return order[-1]


__all__ = ["CANDIDATES", "OUTSIDE", "distribution", "draw"]
