"""From chat-like history to token ids, incrementally, within a maximum trajectory length.

Token in, token out: a trajectory's tokens are what was generated and appended, never a
re-tokenisation of decoded text, so training sees exactly what the rollout saw. The builder
produces the tokens each turn appends — the first prompt, then each observation wrapped in the
chat template — and truncates an observation (keeping its head and tail) or says "finish" when
the trajectory would exceed ``max_len``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from pearl.rl.trajectory import Trajectory

if TYPE_CHECKING:  # a Protocol: importing the torch engine package would load torch
    from pearl.tokenizer import Tokenizer


class ChatFrame(NamedTuple):
    """The token runs a :class:`PromptBuilder` puts around messages, for its tokenizer."""

    user_pre: tuple[int, ...]  # before a user message's text
    user_post: tuple[int, ...]  # after it (opens the assistant's turn)
    close: tuple[int, ...]  # closes an assistant turn that did not stop by itself
    elision: tuple[int, ...]  # marks where a long observation was cut


@dataclass(frozen=True)
class ChatTemplate:
    """Text around messages; the defaults are ChatML (Qwen's format), plain text to a byte model."""

    system: str = ""  # a system message; empty: none
    system_fmt: str = "<|im_start|>system\n{text}<|im_end|>\n"
    user_fmt: str = "<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    assistant_end: str = "<|im_end|>\n"  # closes an assistant turn that did not stop by itself
    elision: str = "\n...[truncated]...\n"


class PromptBuilder:
    """Tokens each turn appends, for one tokenizer and one maximum trajectory length."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_len: int = 2048,
        template: ChatTemplate | None = None,
        min_new_tokens: int = 8,
        add_bos: bool = True,
    ) -> None:
        self.tok = tokenizer
        self.max_len = max_len
        self.t = template or ChatTemplate()
        self.min_new_tokens = min_new_tokens
        self.add_bos = add_bos
        pre, _, post = self.t.user_fmt.partition("{text}")
        self.frame = ChatFrame(
            user_pre=tuple(tokenizer.encode(pre)),
            user_post=tuple(tokenizer.encode(post)),
            close=tuple(tokenizer.encode(self.t.assistant_end)),
            elision=tuple(tokenizer.encode(self.t.elision)),
        )

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Token ids that end an assistant turn (the tokenizer's eos)."""
        return (self.tok.eos_id,) if self.tok.eos_id >= 0 else ()

    def first(self, observation: str) -> tuple[int, ...]:
        """The first prompt: bos, the system message, the first observation as a user turn."""
        head: list[int] = [self.tok.bos_id] if self.add_bos else []
        if self.t.system:
            head += self.tok.encode(self.t.system_fmt.format(text=self.t.system))
        ids = self._user(tuple(head), observation, self.max_len - self.min_new_tokens)
        if ids is None:
            raise ValueError(
                f"max_len={self.max_len} leaves no room for the first prompt's "
                "chat template; raise max_len"
            )
        return ids

    def next(self, trajectory: Trajectory, observation: str) -> tuple[int, ...] | None:
        """Tokens to append for the next turn, or None when the trajectory must finish (full)."""
        last = trajectory.turns[-1] if trajectory.turns else None
        ended = (
            last is not None and last.output_ids[-1:] != () and last.output_ids[-1] in self.stop_ids
        )
        head = () if ended else self.frame.close
        room = self.max_len - trajectory.n_tokens - self.min_new_tokens
        return self._user(head, observation, room)

    def max_new_tokens(self, trajectory: Trajectory, prompt_ids: Sequence[int], want: int) -> int:
        """How many tokens this turn may generate without exceeding ``max_len`` (0: none)."""
        return max(0, min(want, self.max_len - trajectory.n_tokens - len(prompt_ids)))

    def decode(self, output_ids: Sequence[int]) -> str:
        """The action text of generated tokens."""
        return self.tok.decode(tuple(output_ids))

    def render(self, messages: Sequence[tuple[str, str]]) -> tuple[int, ...]:
        """A whole ('system'|'user'|'assistant', text) history from scratch, untruncated.

        Equal to the incremental tokens when every assistant text re-encodes to its tokens and
        no turn stopped on a stop id (byte-level tokenizers); a reference for tests and tools.
        """
        ids: list[int] = [self.tok.bos_id] if self.add_bos else []
        for role, text in messages:
            if role == "system":
                ids += self.tok.encode(self.t.system_fmt.format(text=text))
            elif role == "user":
                ids += [*self.frame.user_pre, *self.tok.encode(text), *self.frame.user_post]
            elif role == "assistant":
                ids += self.tok.encode(text)
                ids += self.frame.close
            else:
                raise ValueError(f"unknown role {role!r}; use system, user or assistant")
        return tuple(ids)

    def _user(self, head: tuple[int, ...], text: str, room: int) -> tuple[int, ...] | None:
        """head + the user turn of ``text``, cut in the middle to fit ``room`` (None: no room)."""
        f = self.frame
        fixed = len(head) + len(f.user_pre) + len(f.user_post)
        body = tuple(self.tok.encode(text))
        if fixed + len(body) > room:
            keep = room - fixed - len(f.elision)
            if keep < 2:
                return None
            body = body[: keep - keep // 2] + f.elision + body[len(body) - keep // 2 :]
        return (*head, *f.user_pre, *body, *f.user_post)


__all__ = ["ChatFrame", "ChatTemplate", "PromptBuilder"]
