"""The prefill -> decode hand-off over a KVChannel (SGLang's shape: one transfer id per request).

The prefill side sends the prompt's K/V plus the first sampled token under the request's
``transfer_id``; the decode side keeps its requests waiting until their transfer arrives (which
may be before or after the request itself) or their deadline passes. Both sides record a
:class:`KVTransferStat`. Runs on the engine thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pearl.engines.base import EngineError, KVChannel, KVTimeout, KVTransferStat
from pearl.engines.sequence import Phase, Seq


def _payload_bytes(meta: dict[str, Any], frames: list[Any]) -> int:
    """Bytes of K/V moved: the frames, or what the sim says it would have moved."""
    return int(meta.get("kv_bytes", sum(memoryview(f).nbytes for f in frames)))


class KVHandoff:
    def __init__(
        self,
        channel: KVChannel,
        timeout_s: float,
        record: Callable[[KVTransferStat], None],
        now: Callable[[], float],
    ) -> None:
        self.channel, self.timeout_s = channel, timeout_s
        self._record, self._now = record, now
        self.waiting: list[Seq] = []  # decode role: requests whose K/V has not arrived

    def ship(
        self, seq: Seq, export: Callable[[Seq], tuple[dict[str, Any], list[Any]]], version: int
    ) -> None:
        """Prefill role: send ``seq``'s prompt K/V and first token to its ``kv_peer``."""
        t0 = self._now()
        try:
            meta, frames = export(seq)
            meta.update(
                rid=seq.rid,
                prompt_tokens=seq.computed,
                first=seq.output[0],
                logprob=seq.logprobs[0],
                version=version,
            )
            self.channel.send(seq.req.kv_peer, seq.req.transfer_id, meta, frames)
        except EngineError:
            raise
        except Exception as e:
            raise EngineError(
                f"prefill engine: shipping the KV of {seq.rid} to "
                f"{seq.req.kv_peer} failed: {type(e).__name__}: {e}"
            ) from e
        self._record(
            KVTransferStat(
                transfer_id=seq.req.transfer_id,
                bytes=_payload_bytes(meta, frames),
                duration_s=self._now() - t0,
                direction="send",
            )
        )

    def expect(self, seq: Seq) -> None:
        """Decode role: wait for ``seq``'s transfer until the timeout."""
        seq.phase = Phase.WAIT_KV
        seq.deadline = time.monotonic() + self.timeout_s
        self.waiting.append(seq)

    def forget(self, seq: Seq) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)

    def poll(self) -> tuple[list[Seq], list[tuple[Seq, EngineError]]]:
        """Requests whose K/V arrived (first token pushed, ``seq.kv`` set), and those failed."""
        arrived: list[Seq] = []
        failed: list[tuple[Seq, EngineError]] = []
        now = time.monotonic()
        for seq in list(self.waiting):
            got = self.channel.poll(seq.req.transfer_id)
            if got is None:
                if now > seq.deadline:
                    self.waiting.remove(seq)
                    failed.append((seq, self._timeout(seq)))
                continue
            self.waiting.remove(seq)
            meta, frames = got
            n = len(seq.req.input_ids)
            if meta.get("prompt_tokens") != n:
                failed.append(
                    (
                        seq,
                        EngineError(
                            f"decode engine: transfer {seq.req.transfer_id!r} holds K/V of "
                            f"{meta.get('prompt_tokens')} tokens, request {seq.rid} has {n}"
                        ),
                    )
                )
                continue
            wire = meta.get("arrived_at", 0.0) - meta.get("sent_at", 0.0)
            took = float(meta.get("transfer_s", wire))  # the sim states its modelled time
            self._record(
                KVTransferStat(
                    transfer_id=seq.req.transfer_id,
                    bytes=_payload_bytes(meta, frames),
                    duration_s=max(took, 0.0),
                    direction="recv",
                )
            )
            seq.push(int(meta["first"]), float(meta["logprob"]))
            seq.kv = (meta, frames)
            arrived.append(seq)
        return arrived, failed

    def _timeout(self, seq: Seq) -> KVTimeout:
        return KVTimeout(
            f"decode engine: no KV for request {seq.rid} (transfer {seq.req.transfer_id!r}) "
            f"within {self.timeout_s:.3f}s at {getattr(self.channel, 'address', '?')}; the "
            "prefill worker failed or never got the request: retry it on a prefill/decode pair"
        )


__all__ = ["KVHandoff"]
