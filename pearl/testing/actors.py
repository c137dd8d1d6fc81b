"""A barrier for pykka actors: wait on the actor's own ordering, not on time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pykka

if TYPE_CHECKING:
    from actors.base import LocalRef

DEFAULT_S = 5.0


def barrier(*refs: pykka.ActorRef[Any] | LocalRef, timeout: float = DEFAULT_S) -> None:
    """Return once each actor, in turn, has handled every message told to it before this call.

    A proxy read queues behind those messages in the actor's inbox, so its answer comes only
    after them. Pass actors in the order messages flow between them (router, then the workers it
    tells, then the router again for their answers). ``refs``: pykka ActorRefs or LocalRefs.
    """
    for r in refs:
        ref = r if isinstance(r, pykka.ActorRef) else r.ref
        ref.proxy().actor_urn.get(timeout=timeout)


__all__ = ["barrier"]
