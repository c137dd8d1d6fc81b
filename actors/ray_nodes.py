"""Ray's nodes and the table's GPUs: which node holds which GPU, and node changes as elastic events.

Each GPU id of the table is held by one Ray node, at a local accelerator index: the node's
``[[cluster.nodes]]`` entry says which (matched by address, node id or a ``KEY=VALUE`` label), or,
without one, the node's own ``pearl-gpus`` label (``ray start --labels '{"pearl-gpus": "8-15"}'``;
ranges joined by ``_``, since Ray's label values hold no comma). :func:`placement` reads that
from Ray's node table and :func:`check_placement` refuses, in one line, a configuration Ray's
cluster cannot run. Both are pure: they read :class:`RayNode` records, never Ray itself.

:class:`RayNodeWatcher` (``[ray] node_events = true``) turns the node table's changes into the
same events a CLI sends, through the ElasticScheduler (so they are logged, and replayed after a
crash): a node that joins holding preemptible GPUs -> ``gpus-added``; a node that dies ->
``gpus-reclaimed``; a node draining with a deadline (Ray's drain API, the autoscaler) -> the
preemption notice ``gpus-reclaiming`` (no deadline: ``gpus-reclaimed`` at once). Only the
preemptible pool follows the nodes; a lost node of reserved or training GPUs is a host loss, handled
by the RoleSupervisor's restart budget. The first look after start reconciles: present preemptible
GPUs whose node is gone are reclaimed, and those of live nodes not yet present are added.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from actors import names
from actors.base import Directory, PearlActor
from actors.messages import StateChanged
from pearl.config import Config, NodeConfig, format_gpus, parse_gpus
from pearl.core import events as ev
from pearl.core.errors import ConfigError, InvalidEvent
from pearl.core.policy import Borrow

#: what a change of Ray's node table logs
NodeEvent = ev.GpusReclaimed | ev.GpusReclaiming | ev.GpusAdded

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayNode:
    """One row of Ray's node table, as PEARL reads it."""

    node_id: str
    address: str
    alive: bool = True
    gpus: int = 0  # its GPU resource
    labels: Mapping[str, str] = field(default_factory=dict)
    drain_deadline: float | None = None  # Unix seconds; 0.0: draining, no deadline; None: not

    @classmethod
    def of(cls, row: Mapping[str, Any], draining: Mapping[str, int]) -> RayNode:
        """From a ``ray.nodes()`` row and ``{node id: drain deadline in ms}``."""
        nid = str(row.get("NodeID", ""))
        ms = draining.get(nid)
        return cls(
            node_id=nid,
            address=str(row.get("NodeManagerAddress", "")),
            alive=bool(row.get("Alive", False)),
            gpus=int(float((row.get("Resources") or {}).get("GPU", 0))),
            labels=dict(row.get("Labels") or {}),
            drain_deadline=None if ms is None else ms / 1000.0,
        )

    def named(self) -> str:
        return f"Ray node {self.node_id[:12]} ({self.address})"


def matches(entry: NodeConfig, node: RayNode) -> bool:
    if entry.node_id:
        return node.node_id == entry.node_id
    if entry.address:
        return node.address == entry.address
    key, _, value = entry.label.partition("=")
    return node.labels.get(key) == value


def held(cfg: Config, node: RayNode) -> tuple[int, ...]:
    """The table's GPUs ``node`` holds: its [[cluster.nodes]] entry's, else its label's, else ()."""
    for entry in cfg.cluster.nodes:
        if matches(entry, node):
            return entry.gpus
    text = node.labels.get(cfg.ray.gpus_label, "")
    if not text:
        return ()
    return parse_gpus(text.replace("_", ","), f"{node.named()} label {cfg.ray.gpus_label}")


def needed(cfg: Config) -> dict[int, str]:
    """GPUs pearld may start workers on right away -> the config key they come from."""
    c = cfg.cluster
    out = {g: "cluster.reserved_gpus" for g in c.reserved_gpus}
    out |= {g: "cluster.initial_preemptible" for g in c.initial_preemptible}
    if cfg.daemon.borrow is not Borrow.NEVER:  # overlap workers run on the training GPUs
        out |= {g: "cluster.training_gpus" for g in c.training_gpus}
    return out


def placement(cfg: Config, nodes: Iterable[RayNode]) -> dict[int, tuple[RayNode, int]]:
    """GPU id -> (the live node holding it, its local accelerator index there)."""
    out: dict[int, tuple[RayNode, int]] = {}
    for node in nodes:
        if node.alive:
            for local, g in enumerate(held(cfg, node)):
                out.setdefault(g, (node, local))
    return out


def check_placement(cfg: Config, nodes: list[RayNode]) -> dict[int, tuple[RayNode, int]]:
    """:func:`placement`, or a one-line ConfigError: a node given more GPUs than it has, two nodes
    holding one GPU, a [[cluster.nodes]] entry no live node matches, a GPU pearld needs at start
    that no live node holds."""
    live = [n for n in nodes if n.alive]
    owner: dict[int, RayNode] = {}
    for node in live:
        gpus = held(cfg, node)
        if len(gpus) > node.gpus:
            raise ConfigError(
                f"{node.named()} holds {node.gpus} GPU(s) but is given {len(gpus)} "
                f"({format_gpus(gpus)}); fix its [[cluster.nodes]] entry or its "
                f"{cfg.ray.gpus_label} label, or start it with --num-gpus={len(gpus)}"
            )
        for g in gpus:
            if g in owner:
                raise ConfigError(
                    f"GPU {g} is held by two Ray nodes, {owner[g].named()} and {node.named()}; "
                    "give each GPU id to one node"
                )
            owner[g] = node
    wanted = needed(cfg)
    for i, entry in enumerate(cfg.cluster.nodes):
        if not any(matches(entry, n) for n in live) and set(entry.gpus) & set(wanted):
            raise ConfigError(
                f"cluster.nodes[{i}] ({entry.names()}, GPUs {format_gpus(entry.gpus)}) matches no "
                "live Ray node; start it (ray start --address=HEAD:PORT ...) or fix the entry"
            )
    missing = sorted(set(wanted) - set(owner))
    if missing:
        where = sorted({wanted[g] for g in missing})
        raise ConfigError(
            f"GPUs {format_gpus(missing)} ({', '.join(where)}) are held by no live Ray node; "
            f"list them in [[cluster.nodes]] or label their node {cfg.ray.gpus_label}=FIRST-LAST"
        )
    return placement(cfg, live)


def node_events(
    cfg: Config,
    before: Mapping[str, RayNode] | None,
    now: Mapping[str, RayNode],
    present: set[int],
    leaving: set[int],
    wall: float,
) -> list[NodeEvent]:
    """The elastic events a change of the node table from ``before`` (None: the first look) to
    ``now`` means, given the table's present and leaving GPUs, at Unix time ``wall``."""
    pool = set(cfg.cluster.preemptible_gpus) & present

    def up(n: RayNode | None) -> bool:
        return n is not None and n.alive

    alive = {nid: n for nid, n in now.items() if n.alive}
    holding = {g for n in alive.values() for g in held(cfg, n)}
    if before is None:
        mapped = {g for e in cfg.cluster.nodes for g in e.gpus}
        mapped |= {g for n in now.values() for g in held(cfg, n)}
        gone = pool & mapped - holding
    else:
        gone = pool & {
            g for nid, n in before.items() if n.alive and not up(now.get(nid)) for g in held(cfg, n)
        }
    out: list[NodeEvent] = [ev.GpusReclaimed(gpus=tuple(sorted(gone)))] if gone else []
    for nid, n in sorted(alive.items()):
        was = before.get(nid) if before is not None else None
        if n.drain_deadline is None or (was is not None and was.drain_deadline is not None):
            continue  # not draining, or its drain was seen already
        gpus = tuple(sorted(pool & set(held(cfg, n)) - leaving - gone))
        if gpus and n.drain_deadline > wall:
            out.append(ev.GpusReclaiming(gpus=gpus, deadline=n.drain_deadline))
        elif gpus:
            out.append(ev.GpusReclaimed(gpus=gpus))
    joined = {
        g
        for nid, n in alive.items()
        if n.drain_deadline is None and (before is None or not up(before.get(nid)))
        for g in held(cfg, n)
    }
    # A node that died and came back within one look: reclaimed above, and added again here.
    added = sorted(joined & set(cfg.cluster.preemptible_gpus) - (present - gone))
    if added:
        out.append(ev.GpusAdded(gpus=tuple(added)))
    return out


def read_nodes(ray: ModuleType) -> dict[str, RayNode]:
    """Ray's node table now (draining nodes with their deadlines)."""
    try:
        draining = dict(ray._private.state.state.get_draining_nodes())
    except Exception:  # an internal API: without it, drains are seen when the node dies
        draining = {}
    return {n.node_id: n for n in (RayNode.of(r, draining) for r in ray.nodes())}


@dataclass(frozen=True)
class NodesSeen:
    """The poller read the node table."""

    nodes: Mapping[str, RayNode]


class RayNodeWatcher(PearlActor):
    """Node join / death / drain -> logged elastic events (see the module docstring)."""

    name = names.NODES

    def __init__(
        self,
        directory: Directory,
        cfg: Config,
        read: Callable[[], Mapping[str, RayNode]],
        initial: StateChanged | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.directory, self.cfg, self.read, self.clock = directory, cfg, read, clock
        self.before: Mapping[str, RayNode] | None = None
        # Granted (present or regranted) and leaving GPUs as the table has them, with what was
        # delivered since the view; the outbox holds what was not delivered yet, in order.
        self.present: set[int] = set()
        self.leaving: set[int] = set()
        self.outbox: deque[NodeEvent] = deque()
        self.seq = -1  # of the view the sets come from
        if initial is not None:
            self.state_changed(initial)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="ray-nodes", daemon=True)

    def on_start(self) -> None:
        self._thread.start()

    def on_stop(self) -> None:
        self._halt.set()

    def _poll(self) -> None:
        while not self._halt.is_set():
            try:
                nodes = self.read()
            except Exception as e:  # the GCS restarting, a network blip: look again
                log.warning("cannot read Ray's node table: %s", e)
            else:
                try:
                    self.actor_ref.tell(NodesSeen(nodes))
                except Exception:  # stopped meanwhile
                    return
            self._halt.wait(self.cfg.ray.poll_s)

    def state_changed(self, msg: StateChanged) -> None:
        t = msg.view.table
        self.present = set(t.present_gpus) | set(t.regranted_gpus)
        self.leaving = {g for g, _ in t.leaving_gpus}
        self.seq = msg.seq

    def seen(self, msg: NodesSeen) -> None:
        """One look: what changed since the last is queued behind what is still undelivered
        (judged against the table as those will leave it), then the queue is delivered."""
        present, leaving = set(self.present), set(self.leaving)
        for record in self.outbox:
            _apply(record, present, leaving)
        self.outbox.extend(
            node_events(
                cfg=self.cfg,
                before=self.before,
                now=msg.nodes,
                present=present,
                leaving=leaving,
                wall=self.clock(),
            )
        )
        self.before = msg.nodes
        self._deliver()

    def _deliver(self) -> None:
        """Send the outbox in order. The world's events are facts: one that could not be
        delivered (pearld busy, its disk full) stays, with all after it, for the next look;
        only one the table refuses as not fitting (already so) is dropped."""
        while self.outbox:
            record = self.outbox[0]
            try:
                ack = self.directory.get(names.SCHEDULER).ask(record, 30.0)
            except InvalidEvent as e:  # the table already says so: nothing to deliver
                log.warning("node event %s refused: %s", type(record).__name__, e)
                self.outbox.popleft()
                continue
            except Exception as e:
                log.warning(
                    "node event %s not delivered (%s); %d event(s) wait for the next look",
                    type(record).__name__,
                    e,
                    len(self.outbox),
                )
                return
            self.outbox.popleft()
            gpus = format_gpus(record.gpus)
            log.info("Ray nodes changed: %s %s logged at seq %s", record.KIND, gpus, ack.seq)
            # Applied at once: the next look must not send it again before the view arrives.
            _apply(record, self.present, self.leaving)

    handles = {StateChanged: state_changed, NodesSeen: seen}


def _apply(record: NodeEvent, present: set[int], leaving: set[int]) -> None:
    """What a delivered node event does to the granted and leaving GPUs."""
    if isinstance(record, ev.GpusAdded):
        present |= set(record.gpus)
    elif isinstance(record, ev.GpusReclaimed):
        present -= set(record.gpus)
        leaving -= set(record.gpus)
    else:
        leaving |= set(record.gpus)


__all__ = [
    "NodesSeen",
    "RayNode",
    "RayNodeWatcher",
    "check_placement",
    "held",
    "matches",
    "needed",
    "node_events",
    "placement",
    "read_nodes",
]
