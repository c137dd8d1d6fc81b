"""A CourierRef tells a remote actor from its own thread: a message that cannot be encoded is
the message's fault, dropped without declaring the peer unreachable; a peer that does not answer
is reported."""

from __future__ import annotations

import threading
from typing import Any

from actors.base import CourierRef
from actors.messages import Generate
from pearl.core.errors import PearlError
from pearl.engines.base import GenerateRequest, SamplingParams
from transports.rpc import Client


def test_an_unencodable_tell_is_dropped_and_the_peer_is_not_blamed() -> None:
    errors: list[tuple[str, Any, PearlError]] = []
    reported = threading.Event()

    def on_error(name: str, msg: Any, error: PearlError) -> None:
        errors.append((name, msg, error))
        reported.set()

    # Nothing listens there: a message that is sent gets no answer and is reported.
    client = Client("tcp://127.0.0.1:9", timeout_s=0.2, retries=0)
    courier = CourierRef("worker/1", client, on_error)
    try:
        poison = Generate(request=GenerateRequest(rid="p", input_ids=(2**64,)))
        seeded = Generate(
            request=GenerateRequest(rid="s", input_ids=(1,), sampling=SamplingParams(seed=2**64))
        )
        fine = Generate(request=GenerateRequest(rid="ok", input_ids=(1, 2)))
        for msg in (poison, seeded, fine):
            courier.tell(msg)
        assert reported.wait(30), "the unanswered tell was never reported"
    finally:
        courier.close()
    assert [(name, msg) for name, msg, _ in errors] == [("worker/1", fine)]
