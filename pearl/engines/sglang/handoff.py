"""The PD hand-off of the sglang engine: bootstrap rooms from prefill to decode over a KVChannel.

PEARL's Router gives the prefill request the decode worker's KV inbox (``kv_peer``) and both
requests one ``transfer_id``. The prefill engine draws a random 63-bit room and sends
``{bootstrap_host, bootstrap_port, bootstrap_room}`` (no frames: SGLang moves the KV itself) under
that id; the decode engine waits for it, and both post the same body with those fields.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pearl.engines.base import GenerateRequest, KVChannel, KVTimeout
from pearl.engines.sglang.protocol import Bootstrap


def offer_room(channel: KVChannel, req: GenerateRequest, host: str, port: int) -> Bootstrap:
    """Prefill side: a fresh room at this server's bootstrap endpoint, told to the decode side."""
    boot = Bootstrap.fresh(host, port)
    channel.send(req.kv_peer, req.transfer_id, boot.fields(), [])
    return boot


def await_room(
    channel: KVChannel, req: GenerateRequest, aborted: Callable[[], bool], timeout_s: float
) -> Bootstrap | None:
    """Decode side: the room the prefill side offered; None when aborted while waiting."""
    deadline = time.monotonic() + timeout_s
    while not aborted():
        got = channel.poll(req.transfer_id)
        if got is not None:
            meta = got[0]
            return Bootstrap(
                str(meta["bootstrap_host"]),
                int(meta["bootstrap_port"]),
                int(meta["bootstrap_room"]),
            )
        if time.monotonic() > deadline:
            raise KVTimeout(
                f"decode engine: no bootstrap room for {req.rid} (transfer "
                f"{req.transfer_id!r}) within {timeout_s:.3f}s; the prefill worker "
                "failed or never got the request: retry it"
            )
        time.sleep(0.002)
    return None


__all__ = ["await_room", "offer_room"]
