"""An agent function as a trajectory's environment: its chat completions through the gateway,
recovered as token-exact turns.

An agent function is ``fn(client, task) -> float``. ``client`` is an ``openai.OpenAI`` on the
gateway's ``/v1`` whose every request carries the trajectory's session id (``X-Session-ID``, also
in ``client.default_headers``), so that its turns are one PEARL session, kept on the worker that
holds its prefix; ``task`` is the
:class:`~pearl.rl.env.Task`; it returns the trajectory's reward. It may run any number of chat
completions, call tools, add user messages, and decide when to stop.

:class:`AgentSession` makes that client. Each chat completion it sends also asks the gateway for
what training needs (vLLM's ``return_token_ids``: the prompt's ids and the response's;
``logprobs``: each sampled token's logprob; every response carries PEARL's
``weight_versions``) and is recorded; the agent gets the response as the gateway sent it (with
token ids and logprobs it may not have asked for). Nothing is re-tokenized.

:meth:`AgentSession.trajectory` turns the recorded responses into a
:class:`~pearl.rl.trajectory.Trajectory`, under these rules:

- turn i+1's prompt must extend turn i's prompt and completion, token for token: the tokens it
  appends (the end of the assistant message, tool results, user messages, chat markers) are the
  environment's, the response's tokens the model's;
- a prompt that does not extend them is refused (:class:`HistoryRewritten`, naming the turn and
  the first token that differs): the agent dropped, reordered or edited history, or a message's
  text does not re-encode to the tokens the model sampled (a completion cut inside a UTF-8
  character, content with leading whitespace, which the gateway strips). A trainer trains one
  sequence per sample, and no one sequence holds both what the model saw at turn i+1 and what it
  generated at turn i, so the trajectory is not trained on rather than trained on wrong;
- a response whose tokens span weights versions (a new version was loaded mid-turn) becomes one
  turn per version, so each token keeps the version that sampled it;
- refused before they reach the gateway (a 400 to the agent, and :meth:`AgentSession.trajectory`
  raises :class:`AgentError`): ``stream=true``, ``n`` > 1 (one session is one sequence), and the
  completions endpoint. Other requests (``/v1/models``) pass through unrecorded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx  # what the openai SDK (>= 3.63) runs on

from pearl.core.errors import PearlError
from pearl.rl.env import Task
from pearl.rl.trajectory import Trajectory, Turn

AgentFn = Callable[[Any, Task], float]  # (openai.OpenAI, task) -> reward


class AgentError(PearlError):
    """An agent's session cannot be trained on as it ran (what it asked for, or made none)."""


class HistoryRewritten(AgentError):
    """A turn's prompt does not extend the previous turn's prompt and completion."""


@dataclass(frozen=True)
class Served:
    """One chat completion as the gateway served it."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[tuple[int, int], ...]  # (first token index, weights version) per change
    finish_reason: str
    migrations: int = 0

    @classmethod
    def of(cls, body: dict[str, Any]) -> Served:
        """The ids, logprobs and versions of a chat response (``return_token_ids``,
        ``logprobs``)."""
        (choice,) = body["choices"]
        ids = tuple(int(i) for i in choice["token_ids"])
        lps = tuple(float(x["logprob"]) for x in (choice["logprobs"] or {}).get("content") or ())
        if len(lps) != len(ids):
            raise AgentError(f"a chat response has {len(ids)} token ids and {len(lps)} logprobs")
        return cls(
            prompt_ids=tuple(int(i) for i in body["prompt_token_ids"]),
            output_ids=ids,
            logprobs=lps,
            versions=tuple((int(k), int(v)) for k, v in choice["weight_versions"]),
            finish_reason=str(choice["finish_reason"]),
            migrations=int((body.get("usage") or {}).get("migrations", 0)),
        )

    def turns(self, new_prompt: Sequence[int]) -> list[Turn]:
        """This response as trajectory turns: ``new_prompt`` then the output, cut where the
        weights version changes (the later parts append no prompt tokens)."""
        cuts = [k for k, _ in self.versions if 0 < k < len(self.output_ids)]
        bounds = [0, *cuts, len(self.output_ids)]
        version = dict(self.versions)
        out = []
        for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
            v = version.get(a, self.versions[0][1] if self.versions else 0)
            out.append(
                Turn(
                    prompt_ids=tuple(new_prompt) if i == 0 else (),
                    output_ids=self.output_ids[a:b],
                    logprobs=self.logprobs[a:b],
                    weights_version=v,
                    finish_reason=self.finish_reason if b == len(self.output_ids) else "abort",
                )
            )
        return out


def _refusal(path: str, body: Any) -> str | None:
    """Why a request of an agent's session is refused before it reaches the gateway, or None."""
    if path.endswith("/completions") and not path.endswith("/chat/completions"):
        return "an agent's turns are chat completions: /v1/completions is not recorded"
    if not isinstance(body, dict):
        return "a chat completion's body is a JSON object"
    if body.get("stream"):
        return "an agent's chat completions are not streamed here (stream=true)"
    if (body.get("n") or 1) != 1:
        return "one session is one sequence: n must be 1"
    return None


class _Recorder(httpx.BaseTransport):
    """Sets the session id, asks each chat completion for its token ids and logprobs, records
    the answer; refuses what cannot be recorded (see the module)."""

    def __init__(self, session: str, defaults: dict[str, Any]) -> None:
        self.inner = httpx.HTTPTransport()
        self.session, self.defaults = session, defaults
        self.served: list[Served] = []
        self.refused: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["X-Session-ID"] = self.session
        path = request.url.path
        if request.method != "POST" or not path.endswith("/completions"):
            return self.inner.handle_request(request)
        try:
            body = json.loads(request.read() or b"null")
        except ValueError:
            body = None
        why = _refusal(path, body)
        if why is not None:
            self.refused.append(why)
            error = {"message": why, "type": "invalid_request_error", "param": None}
            return httpx.Response(400, json={"error": error}, request=request)
        for k, v in self.defaults.items():
            if body.get(k) is None:
                body[k] = v
        body["return_token_ids"] = body["logprobs"] = True
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("content-length",)}
        sent = httpx.Request(
            request.method, request.url, headers=headers, content=json.dumps(body).encode()
        )
        response = self.inner.handle_request(sent)
        content = response.read()
        if response.status_code == 200:
            self.served.append(Served.of(json.loads(content)))
        keep = [
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() not in ("content-length", "content-encoding", "transfer-encoding")
        ]
        return httpx.Response(response.status_code, headers=keep, content=content, request=request)

    def close(self) -> None:
        self.inner.close()


class AgentSession:
    """One trajectory's session: :attr:`client` for the agent function, then
    :meth:`trajectory` from what the gateway served it.

    ``defaults``: request fields set where the agent left them out (the trainer's
    ``temperature`` and ``top_p``, so that the logprobs are of the distribution it trains)."""

    def __init__(
        self,
        base_url: str,
        session: str,
        *,
        api_key: str | None = None,
        defaults: dict[str, Any] | None = None,
        timeout_s: float = 600.0,
        retries: int = 20,
    ) -> None:
        import openai

        self.session = session
        self._recorder = _Recorder(session, dict(defaults or {}))
        root = base_url.rstrip("/").removesuffix("/v1")
        self._http = httpx.Client(transport=self._recorder, timeout=timeout_s)
        self.client = openai.OpenAI(
            base_url=f"{root}/v1",
            api_key=api_key or "none",
            http_client=self._http,
            default_headers={"X-Session-ID": session},  # the agent may read it there
            max_retries=retries,  # the gateway's 429 / 503, after their Retry-After
        )

    @property
    def served(self) -> list[Served]:
        return list(self._recorder.served)

    @property
    def migrations(self) -> int:
        return sum(s.migrations for s in self._recorder.served)

    def trajectory(
        self,
        *,
        trajectory_id: str,
        group_id: str,
        task_id: str,
        reward: float,
        decode: Callable[[Sequence[int]], str] | None = None,
    ) -> Trajectory:
        """The session as a trajectory with ``reward`` (see the module's rules)."""
        if self._recorder.refused:
            raise AgentError(f"session {self.session}: {self._recorder.refused[0]}")
        return trajectory_of(
            self._recorder.served,
            session=self.session,
            trajectory_id=trajectory_id,
            group_id=group_id,
            task_id=task_id,
            reward=reward,
            decode=decode,
        )

    def close(self) -> None:
        self._http.close()


def trajectory_of(
    served: Sequence[Served],
    *,
    session: str,
    trajectory_id: str,
    group_id: str,
    task_id: str,
    reward: float,
    decode: Callable[[Sequence[int]], str] | None = None,
) -> Trajectory:
    """The trajectory of a session's chat completions, in the order they were served: each
    turn appends the tokens its prompt adds to the last one's prompt and completion (the
    environment's), then its completion (one turn per weights version); ``reward`` on the last.
    Raises :class:`HistoryRewritten` where a prompt does not extend them."""
    if not served:
        raise AgentError(f"session {session}: the agent ran no chat completion")
    traj = Trajectory(id=trajectory_id, group_id=group_id, task_id=task_id)
    seen: tuple[int, ...] = ()
    for i, s in enumerate(served):
        if s.prompt_ids[: len(seen)] != seen:
            raise HistoryRewritten(_rewritten(session, i, seen, s.prompt_ids, decode))
        for turn in s.turns(s.prompt_ids[len(seen) :]):
            traj = traj.add_turn(turn)
        seen = s.prompt_ids + s.output_ids
    return traj.add_step(float(reward), 0.0).finish()


def _rewritten(
    session: str,
    turn: int,
    seen: Sequence[int],
    prompt: Sequence[int],
    decode: Callable[[Sequence[int]], str] | None,
) -> str:
    k = next(
        (j for j, (a, b) in enumerate(zip(seen, prompt, strict=False)) if a != b),
        min(len(seen), len(prompt)),
    )

    def show(ids: Sequence[int]) -> str:
        part = list(ids[k : k + 12])
        return f"{part}" + (f" {decode(part)!r}" if decode else "")

    return (
        f"session {session}: turn {turn}'s prompt does not extend turn {turn - 1}'s prompt and "
        f"completion ({len(seen)} tokens); they differ from token {k}: {show(prompt)} where the "
        f"model's context had {show(seen)}. The agent dropped or edited history, or a message "
        "did not re-encode to the tokens the model sampled; a trainer cannot train one sequence "
        "on both turns"
    )


__all__ = [
    "AgentError",
    "AgentFn",
    "AgentSession",
    "HistoryRewritten",
    "Served",
    "trajectory_of",
]
