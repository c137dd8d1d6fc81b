"""PEARL's grammar for vLLM (``--logits-processors pearl_vllm_grammar:PearlGrammar``).

A vLLM v1 logits processor: a request whose per-request extra args (the OpenAI field
``vllm_xargs``, vLLM's ``SamplingParams.extra_args``) carry :data:`GRAMMAR` (an llguidance
grammar, as PEARL's ``llguidance_text`` writes it) decodes under that grammar, and one that
also carries :data:`GENERATED` = k decodes from the state that the last k prompt ids leave:
output an earlier attempt generated, kept when the request moved (reclaim, notice, return) and
sent back as part of the prompt. vLLM's own ``structured_outputs`` would start the grammar again
after it.

Rules:

- the matcher of a request is built when the request enters the batch (again after a
  preemption), from the server's own tokenizer (as vLLM's ``guidance`` backend builds it; once
  per grammar text, copied per request), and
  fed the kept prefix, then every output token so far; before each sample it consumes the
  tokens sampled since (the output list comes by reference in the batch update);
- the tokens the grammar does not allow next get ``-inf`` before sampling (and before
  penalties, temperature and top-k/top-p); the logprobs vLLM returns stay the raw ones
  (``raw_logprobs``), as the torch engine's;
- a complete grammar, or one the prefix left in error, allows EOS only; the request ends at its
  stop ids (PEARL stops at EOS) or its length. Nothing here raises during a step: an exception
  in a logits processor would fail every request of the engine;
- requests without :data:`GRAMMAR` are not touched.

It runs inside vLLM's environment, which need not have PEARL installed: it imports nothing of
PEARL. It implements the interface of vLLM's V1 model runner (PEARL launches its servers with
``VLLM_USE_V2_MODEL_RUNNER=0``; the V2 runner takes another interface).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

GRAMMAR = "pearl_grammar"  # extra arg: the llguidance grammar text
GENERATED = "pearl_generated"  # extra arg: how many trailing prompt ids are earlier output
_CACHE = 64  # compiled grammars kept (the oldest dropped past it)
_SHIFTS = torch.arange(32, dtype=torch.int32)

log = logging.getLogger(__name__)


def _ll_tokenizer(model_config: Any, vocab_size: int) -> Any:
    """The server's tokenizer as llguidance reads it, built as vLLM's ``guidance`` backend
    builds it (padded to the model's vocabulary). A server without one cannot start with this
    processor (PEARL never launches with ``--skip-tokenizer-init``)."""
    from vllm.tokenizers import cached_tokenizer_from_config
    from vllm.v1.structured_output.backend_guidance import GuidanceBackend

    tok = cached_tokenizer_from_config(model_config=model_config)
    if tok is None:
        raise ValueError("PEARL's grammar processor needs the server's tokenizer")
    return GuidanceBackend._build_ll_tokenizer(tok, vocab_size)


class _Req:
    """One request's matcher and how many of its output tokens it has consumed."""

    def __init__(self, matcher: Any, output: list[int]) -> None:
        self.m, self.output, self.fed = matcher, output, 0

    def sync(self) -> None:
        """Consume the output tokens sampled since the last call (none past a placeholder)."""
        out = self.output
        n = len(out)
        if n > self.fed and out[n - 1] < 0:  # async scheduling: not yet resolved
            n = self.fed
            while n < len(out) and out[n] >= 0:
                n += 1
        if n > self.fed:
            if not self.m.is_stopped() and not self.m.consume_tokens(out[self.fed : n]):
                log.warning("PEARL grammar: the output left its grammar: %s", self.m.get_error())
            self.fed = n


class PearlGrammar(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        args = sampling_params.extra_args or {}
        if GRAMMAR not in args:
            return
        if not isinstance(args[GRAMMAR], str):
            raise ValueError(f"{GRAMMAR} must be an llguidance grammar (a string)")
        k = args.get(GENERATED, 0)
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(f"{GENERATED} must be an integer >= 0, got {k!r}")

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.model_config = vllm_config.model_config
        self.vocab_size = self.model_config.get_vocab_size()
        self.device = device
        self.reqs: dict[int, _Req] = {}
        self._ll = _ll_tokenizer(self.model_config, self.vocab_size)
        self._compiled: dict[str, Any] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy picks

    # -- state -------------------------------------------------------------------------------

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.reqs, batch_update, self._new)

    def _new(self, params: Any, prompt: list[int] | None, output: list[int]) -> _Req | None:
        args = params.extra_args or {}
        text = args.get(GRAMMAR)
        if text is None:
            return None
        k = int(args.get(GENERATED, 0))
        m = self._matcher(text).deep_copy()
        if k and prompt is not None and not m.consume_tokens(list(prompt[len(prompt) - k :])):
            log.warning("PEARL grammar: the kept prefix left its grammar: %s", m.get_error())
        return _Req(m, output)

    def _matcher(self, text: str) -> Any:
        """The matcher of ``text`` at its start (compiled once per text)."""
        import llguidance

        m = self._compiled.get(text)
        if m is None:
            m = llguidance.LLMatcher(self._ll, text, log_level=0)
            if m.is_error():
                log.warning("PEARL grammar does not compile: %s", m.get_error())
            if len(self._compiled) >= _CACHE:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[text] = m
        return m

    # -- the step ----------------------------------------------------------------------------

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.reqs:
            return logits
        rows = sorted(i for i in self.reqs if i < logits.shape[0])
        if not rows:
            return logits
        words = np.empty((len(rows), (self._ll.vocab_size + 31) // 32), dtype=np.int32)
        for j, i in enumerate(rows):
            r = self.reqs[i]
            r.sync()
            # llguidance writes the row in place; a stopped or failed matcher allows EOS only.
            r.m.unsafe_compute_mask_ptr(words[j].ctypes.data, words[j].nbytes)
        bits = torch.from_numpy(words).to(logits.device)
        ok = ((bits[:, :, None] >> _SHIFTS.to(logits.device)) & 1).reshape(len(rows), -1) != 0
        width = min(ok.shape[1], logits.shape[1])
        idx = torch.tensor(rows, device=logits.device)
        block = logits[idx]
        block[:, :width].masked_fill_(~ok[:, :width], float("-inf"))
        block[:, width:] = float("-inf")
        logits[idx] = block
        return logits
