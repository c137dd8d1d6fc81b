"""Structured outputs in the in-process engines: a grammar per request, a token mask per step.

A request's constraint travels in ``SamplingParams.grammar`` as a :class:`Grammar` (a kind and a
text: serialisable, the same on every worker). The engine compiles it with llguidance (the
grammar engine behind vLLM's ``guidance`` backend and llama.cpp's), once per spec
(:class:`GrammarBook` keeps the compiled matchers and copies one per sequence), and before each
sample masks the tokens the grammar does not allow next. The matcher follows the sequence's
output (:meth:`Constrained.sync`), whoever produced it: this engine's sampler, a prefill worker
(PD), or an earlier attempt whose prefix came back as the last ``GenerateRequest.output_prefix``
prompt ids (a migrated request finishes under the same grammar, from the state its prefix left).

Finishing within the budget: a model may wander (a random-weight one always does), and a JSON
value cut at ``max_tokens`` does not parse. In the last :func:`reserve` tokens of its budget a
constrained sequence prefers, among the tokens the grammar allows, those that close the structure
(end of text, ``}``, ``]``, ``"``, a digit, ...), so it ends well-formed where the grammar can be
closed in that many tokens. A model that finishes earlier is never touched by this.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pearl.core.errors import RequestRefused
from pearl.core.schema import Value
from pearl.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

if TYPE_CHECKING:
    from pearl.engines.sequence import Seq

KINDS = ("json", "regex", "choice", "grammar")
CLOSE_RESERVE = 256  # at most this many last tokens of a budget lean toward closing
# Token texts that close a structure, most closing first (end of text comes before all). The
# quote comes first: inside a string it ends the string, where "}" would only be more text.
_CLOSERS = ('"', "}", "]", "0", "1", ",", ":", "null", "n", "t", "f", "{", "[", "\n", "<", "/")


class Grammar(Value, frozen=True):
    """A constraint on a request's output: ``kind`` one of :data:`KINDS`.

    ``json``: a JSON schema (its JSON text); ``regex``: a regular expression (Rust ``regex``
    syntax); ``choice``: a JSON list of strings, the output is one of them; ``grammar``: a Lark
    grammar (llguidance's dialect, ``%json{...}`` embeds a schema) or a GBNF one.
    """

    kind: str
    text: str


def llguidance_text(g: Grammar) -> str:
    """The llguidance grammar of ``g``. JSON is compact (no free whitespace between tokens, as
    vLLM's ``disable_any_whitespace``), so a wandering model cannot pad it forever."""
    import llguidance as llg

    if g.kind == "json":
        return str(
            llg.LLMatcher.grammar_from_json_schema(g.text, overrides={"whitespace_flexible": False})
        )
    if g.kind == "regex":
        return str(llg.grammar_from("regex", g.text))
    if g.kind == "choice":
        return str(llg.grammar_from("choice", g.text))
    if g.kind == "grammar":
        return str(llg.grammar_from("grammar", g.text))
    raise ValueError(f"unknown grammar kind {g.kind!r}; kinds: {', '.join(KINDS)}")


@functools.lru_cache(maxsize=256)
def problem(g: Grammar) -> str | None:
    """Why llguidance cannot compile ``g`` (its own message: ``Unimplemented keys: ["if"]``),
    or None. Needs no tokenizer; cached per spec."""
    import llguidance as llg

    try:
        text = llguidance_text(g)
    except (ValueError, TypeError) as e:
        return str(e)
    err = str(llg.LLMatcher.validate_grammar(text))
    return err or None


def ll_tokenizer(tok: Tokenizer, vocab_size: int) -> Any:
    """An ``llguidance.LLTokenizer`` of the engine's tokenizer, padded to the model's
    vocabulary (ids beyond the tokenizer's are never allowed)."""
    import llguidance as llg

    if isinstance(tok, HFTokenizer):
        eos = tok.eos_id if tok.eos_id >= 0 else None
        return llg.LLTokenizer(tok._tok.to_str(), n_vocab=max(vocab_size, tok.vocab_size),
                               eos_token=eos)  # fmt: skip
    if isinstance(tok, ByteTokenizer):
        return llg.LLTokenizer(llg.TokenizerWrapper(_ByteVocab(vocab_size)), n_vocab=vocab_size)
    raise RequestRefused(
        f"structured outputs need a tokenizer.json (a fast tokenizer); "
        f"{type(tok).__name__} has none"
    )


class _ByteVocab:
    """:class:`ByteTokenizer` as llguidance's ``TokenizerWrapper`` reads a tokenizer."""

    def __init__(self, vocab_size: int) -> None:
        b = ByteTokenizer
        self.eos_token_id, self.bos_token_id = b.eos_id, b.bos_id
        self.special_token_ids = [b.bos_id, b.eos_id, b.pad_id]
        names = [b"<|bos|>", b"<|eos|>", b"<|pad|>"]
        spare = [b"<|spare_%d|>" % i for i in range(b.vocab_size, max(vocab_size, b.vocab_size))]
        self.tokens = [bytes([i]) for i in range(256)] + names + spare
        self.special_token_ids += list(range(b.vocab_size, len(self.tokens)))

    def __call__(self, s: bytes | str) -> list[int]:
        return list(s.encode() if isinstance(s, str) else s)


class Constrained:
    """One sequence's matcher and how much of its output it has consumed."""

    def __init__(
        self, matcher: Any, closers: Sequence[int], vocab_size: int, words: int = 0
    ) -> None:
        self.m, self.closers, self.vocab_size = matcher, closers, vocab_size
        self.words = words or (vocab_size + 31) // 32  # int32 words of llguidance's bitmask
        self.fed = 0  # output tokens consumed

    def feed(self, tokens: Sequence[int]) -> None:
        if tokens and not self.m.consume_tokens(list(tokens)):
            raise RequestRefused(f"the output left its grammar: {self.m.get_error()}")

    def sync(self, output: Sequence[int]) -> None:
        """Consume the output tokens not consumed yet."""
        if len(output) > self.fed:
            self.feed(output[self.fed :])
            self.fed = len(output)

    def stopped(self, output: Sequence[int]) -> bool:
        """The grammar is complete and takes nothing more: the sequence ends here."""
        self.sync(output)
        return bool(self.m.is_stopped())

    def fill(self, output: Sequence[int], left: int, words: np.ndarray) -> None:
        """Write the tokens allowed next, with ``left`` tokens of budget, into ``words``: a
        row of :attr:`words` int32 (llguidance's bitmask, bit ``t % 32`` of word ``t // 32``),
        in place, by llguidance itself (no per-token work in Python)."""
        self.sync(output)
        if self.m.is_error():
            raise RequestRefused(f"the grammar failed: {self.m.get_error()}")
        assert words.dtype == np.int32 and words.size == self.words and words.flags.c_contiguous
        self.m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        if left <= reserve(left + len(output)):
            bits = words.view(np.uint32)
            for t in self.closers:
                if t < self.vocab_size and (int(bits[t >> 5]) >> (t & 31)) & 1:
                    bits[:] = 0
                    bits[t >> 5] = np.uint32(1 << (t & 31))
                    return

    def allowed(self, output: Sequence[int], left: int) -> np.ndarray:
        """Boolean mask [vocab] of the tokens allowed next, with ``left`` tokens of budget."""
        words = np.zeros(self.words, dtype=np.int32)
        self.fill(output, left, words)
        return np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab_size].astype(
            bool
        )


def reserve(budget: int) -> int:
    """Tokens at the end of a ``budget`` in which a constrained sequence leans to closing."""
    return min(budget // 2, CLOSE_RESERVE)


class GrammarBook:
    """An engine's grammars: its llguidance tokenizer (built on first use) and one compiled
    matcher per spec, copied for each sequence."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, cap: int = 128) -> None:
        self.tokenizer, self.vocab_size, self.cap = tokenizer, vocab_size, cap
        self._ll: Any = None
        self._closers: list[int] = []
        self._compiled: dict[Grammar, Any] = {}

    def _tok(self) -> Any:
        if self._ll is None:
            self._ll = ll_tokenizer(self.tokenizer, self.vocab_size)
            ids = [self._ll.eos_token]
            for text in _CLOSERS:
                one = self.tokenizer.encode(text)
                if len(one) == 1 and one[0] not in ids:
                    ids.append(one[0])
            self._closers = ids
        return self._ll

    def compiled(self, g: Grammar) -> Any:
        """The matcher of ``g`` at its start (compiled once; the oldest is dropped past cap)."""
        import llguidance as llg

        m = self._compiled.get(g)
        if m is None:
            m = llg.LLMatcher(self._tok(), llguidance_text(g), log_level=0)
            if m.is_error():
                raise RequestRefused(f"the {g.kind} grammar does not compile: {m.get_error()}")
            if len(self._compiled) >= self.cap:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[g] = m
        return m

    def start(self, g: Grammar, prefix: Sequence[int] = ()) -> Constrained:
        """A sequence's matcher, advanced over ``prefix`` (output kept from earlier attempts)."""
        m = self.compiled(g).deep_copy()
        c = Constrained(m, self._closers, self.vocab_size, (self._ll.vocab_size + 31) // 32)
        c.feed(prefix)
        return c


def left(seq: Seq, max_seq_len: int) -> int:
    """Tokens of budget an engine ``Seq`` has left (its request's and the context's)."""
    return min(seq.req.sampling.max_new_tokens - len(seq.output), max_seq_len - len(seq.tokens))


def masks(seqs: Sequence[Seq], max_seq_len: int) -> tuple[list[int], np.ndarray] | None:
    """The rows of ``seqs`` (engine ``Seq`` s about to sample) under a grammar and their allowed
    tokens [rows, vocab]; None when none is constrained."""
    rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
    if not rows:
        return None
    return rows, np.stack([seqs[i].grammar.allowed(seqs[i].output, left(seqs[i], max_seq_len))
                           for i in rows])  # fmt: skip


def restrict(samples: list[Any], seqs: Sequence[Any], max_seq_len: int) -> list[Any]:
    """``samples`` (the sim engine's hashed draws, one per seq) with each constrained one that
    the grammar does not allow replaced by an allowed token its hash picks."""
    found = masks(seqs, max_seq_len)
    if found is None:
        return samples
    out = list(samples)
    for i, ok in zip(*found, strict=True):
        s = out[i]
        if not ok[s.token]:
            allowed = np.flatnonzero(ok)
            out[i] = s._replace(token=int(allowed[s.token % allowed.size]))
    return out


def schema_text(schema: object) -> str:
    """A JSON schema as the text a :class:`Grammar` carries."""
    return schema if isinstance(schema, str) else json.dumps(schema, separators=(",", ":"))


__all__ = [
    "CLOSE_RESERVE",
    "KINDS",
    "Constrained",
    "Grammar",
    "GrammarBook",
    "left",
    "llguidance_text",
    "masks",
    "problem",
    "reserve",
    "restrict",
    "schema_text",
]
