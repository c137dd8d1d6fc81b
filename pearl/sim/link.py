"""KV-cache transfers from prefill to decode workers over shared links.

A transfer between workers on different nodes crosses the sender node's link out and the
receiver node's link in (``link_Bps`` each, shared by every transfer using them); one within a node
goes over NVLink (``nvlink_Bps``, its own). A transfer moves at the smallest fair share of the
links it crosses, recomputed whenever a transfer starts or ends (processor sharing), so many
prefill workers pushing into one decode node queue there. Each transfer also pays a fixed latency
(handshake, page metadata), counted as bytes at the link rate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pearl.sim import clock as ck
from pearl.sim.clock import Clock

if TYPE_CHECKING:
    from pearl.sim.trajectory import Traj
    from pearl.sim.worker import SimWorker


class _Flow:
    __slots__ = ("tr", "src", "dst", "left", "rate", "links")

    def __init__(
        self,
        tr: Traj,
        src: SimWorker,
        dst: SimWorker,
        left: float,
        links: tuple[tuple[str, int], ...],
    ) -> None:
        self.tr, self.src, self.dst, self.left, self.rate = tr, src, dst, left, 0.0
        self.links = links


class Link:
    """Processor-sharing transfers; calls ``done(tr)`` when a trajectory's KV has arrived."""

    def __init__(
        self,
        clock: Clock,
        link_Bps: float,
        nvlink_Bps: float,
        done: Callable[[Traj], None],
        latency_s: float = 0.0,
    ) -> None:
        self.clock = clock
        self.Bps = link_Bps
        self.nv_Bps = nvlink_Bps
        self.latency_s = latency_s
        self.done = done
        self.flows: dict[Traj, _Flow] = {}
        self.t_last = clock.now
        self.version = 0
        self.bytes_moved = 0.0

    def start(self, tr: Traj, src: SimWorker, dst: SimWorker, nbytes: float) -> None:
        self._advance()
        if src.node == dst.node:
            links: tuple[tuple[str, int], ...] = (("nv", id(src)),)
            rate = self.nv_Bps
        else:
            links = (("out", src.node), ("in", dst.node))
            rate = self.Bps
        nbytes = max(0.0, nbytes)
        self.flows[tr] = _Flow(
            tr=tr, src=src, dst=dst, left=nbytes + self.latency_s * rate, links=links
        )
        self.bytes_moved += nbytes
        self._reschedule()

    def cancel(self, tr: Traj) -> None:
        if tr in self.flows:
            self._advance()
            del self.flows[tr]
            self._reschedule()

    def on_event(self, version: int) -> None:
        if version != self.version:
            return
        self._advance()
        finished = [f for f in self.flows.values() if f.left <= f.rate * 1e-9 + 1.0]
        for f in finished:
            del self.flows[f.tr]
        self._reschedule()
        for f in finished:
            self.done(f.tr)

    def _advance(self) -> None:
        now = self.clock.now
        dt = now - self.t_last
        self.t_last = now
        if dt > 0:
            for f in self.flows.values():
                f.left -= f.rate * dt

    def _reschedule(self) -> None:
        self.version += 1
        if not self.flows:
            return
        users: dict[tuple[str, int], int] = {}
        for f in self.flows.values():
            for link in f.links:
                users[link] = users.get(link, 0) + 1
        t = float("inf")
        for f in self.flows.values():
            f.rate = min(
                (self.nv_Bps if link[0] == "nv" else self.Bps) / users[link] for link in f.links
            )
            t = min(t, f.left / f.rate)
        self.clock.at(self.clock.now + max(t, 0.0), ck.XFER, self, self.version)


__all__ = ["Link"]
