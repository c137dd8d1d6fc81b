"""A client actor for tests that route requests through PEARL's Router: it sends each
request, resubmits an aborted one's continuation (prompt + the tokens so far), and keeps what
every request finally generated."""

from __future__ import annotations

from typing import Any

from actors import base, names
from actors.messages import GenerateDone, Route
from pearl.engines.base import FinishReason, GenerateRequest, SamplingParams


class Trainer(base.PearlActor):
    # Not names.TRAINER: pearld hands a trainer actor of that name the borrow hand-offs.
    name = names.ROLLOUT_CLIENT

    def __init__(self, directory: base.Directory) -> None:
        super().__init__()
        self.d = directory
        self.want: dict[str, tuple[tuple[int, ...], int]] = {}  # rid -> (prompt, tokens)
        self.got: dict[str, list[int]] = {}
        self.finished: dict[str, list[int]] = {}
        self.errors: list[str] = []
        self.aborts = 0
        self.versions: dict[str, list[int]] = {}  # rid -> the weights version of each answer
        self.sends: dict[str, int] = {}

    def submit(self, rid: str, prompt: tuple[int, ...], n: int) -> None:
        self.want[rid] = (prompt, n)
        self.got[rid] = []
        self._send(rid)

    def _send(self, rid: str) -> None:
        prompt, n = self.want[rid]
        so_far = self.got[rid]
        self.sends[rid] = self.sends.get(rid, 0) + 1
        sampling = SamplingParams(max_new_tokens=n - len(so_far), temperature=0.0)
        self.d.tell(
            names.ROUTER,
            Route(
                request=GenerateRequest(
                    rid=rid, input_ids=prompt + tuple(so_far), sampling=sampling
                ),
                reply_to=self.name,
            ),
        )

    def done(self, msg: GenerateDone) -> None:
        if msg.result is None:
            self.errors.append(msg.error)
            self._send(msg.rid)  # the router gave up retrying: the trainer asks again
            return
        self.got[msg.rid].extend(msg.result.output_ids)
        self.versions.setdefault(msg.rid, []).append(msg.result.weights_version)
        if msg.result.finish_reason is FinishReason.ABORT:
            self.aborts += 1
            self._send(msg.rid)
        else:
            self.finished[msg.rid] = self.got[msg.rid]

    def status(self) -> dict[str, Any]:
        return {
            "finished": dict(self.finished),
            "got": {k: list(v) for k, v in self.got.items()},
            "aborts": self.aborts,
            "errors": list(self.errors),
            "versions": dict(self.versions),
            "sends": dict(self.sends),
        }

    handles = {GenerateDone: done}
