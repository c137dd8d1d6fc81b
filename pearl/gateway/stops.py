"""Stop strings (OpenAI's ``stop``, SGLang's ``sampling_params.stop``) over token ids.

The pool generates token ids and knows no strings, so the gateway watches the text its deltas
decode to. The rules, as vLLM and SGLang keep them:

- The response ends at the first place its text holds any stop string; the finish reason is
  ``stop``. Generation stops there: the rest of the request is aborted in the pool.
- Its token ids end with the token whose text completed the stop string (the tokens the model
  generated, so a trainer can score exactly them); later tokens of the same delta are dropped.
- Its text leaves the stop string out (SGLang's ``no_stop_trim`` and vLLM's
  ``include_stop_str_in_output`` keep it), and a stream holds
  back the text that may be the start of a stop string until the next text settles it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pearl.gateway.backend import GatewayError

Stops = tuple[str, ...]


def stops_of(stop: str | Sequence[str] | None, param: str) -> Stops:
    """The request's stop strings, in order, each once; a 400 for an empty one."""
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else list(stop)
    if any(not s for s in items):
        raise GatewayError("stop strings must not be empty", param=param)
    return tuple(dict.fromkeys(items))


def find_stop(text: str, stops: Stops, start: int = 0) -> tuple[int, str] | None:
    """(index, stop string) of the first stop string in ``text`` at or after ``start``."""
    hits = [(i, s) for s in stops if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def cut(text: str, stops: Stops, keep: bool = False) -> str:
    """``text`` up to its first stop string (through it, with ``keep``)."""
    hit = find_stop(text, stops)
    if hit is None:
        return text
    i, s = hit
    return text[: i + len(s)] if keep else text[:i]


def stop_at(tok: Any, seen: Sequence[int], new: Sequence[int], stops: Stops) -> int | None:
    """How many of ``new`` ids (after ``seen``) it takes for the text to hold a stop string that
    ``seen``'s text did not: the first count whose decoded text does, by bisection; None when
    all of ``new`` does not."""
    head = tok.decode(list(seen))
    start = max(0, len(head) - max(len(s) for s in stops) + 1)

    def hit(k: int) -> bool:
        return find_stop(tok.decode([*seen, *new[:k]]), stops, start) is not None

    if not new or not hit(len(new)):
        return None
    lo, hi = 1, len(new)
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class StopText:
    """A stream's text between the detokenizer and the client: cut at the first stop string
    (after it, with ``keep_stop``), and held back while its end may still become one."""

    def __init__(self, stops: Stops, keep_stop: bool = False) -> None:
        self.stops, self.keep_stop = stops, keep_stop
        self.keep = max((len(s) for s in stops), default=1) - 1
        self.buf = ""
        self.done = False

    def push(self, text: str, final: bool) -> str:
        if not self.stops:
            return text
        if self.done:
            return ""
        self.buf += text
        hit = find_stop(self.buf, self.stops)
        if hit is not None:
            end = hit[0] + len(hit[1]) if self.keep_stop else hit[0]
            out, self.buf, self.done = self.buf[:end], "", True
            return out
        n = len(self.buf) if final else len(self.buf) - self.keep
        if n <= 0:
            return ""
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


__all__ = ["StopText", "Stops", "cut", "find_stop", "stop_at", "stops_of"]
