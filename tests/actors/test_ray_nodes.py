"""Ray's nodes and the table's GPUs, without Ray: placement, the start-up checks, node changes as
elastic events, the keys a launcher hands a host, and pearld's one line when Ray is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from actors import names
from actors.ray_nodes import RayNode, check_placement, held, node_events, placement
from pearl import config
from pearl.core import events as ev
from pearl.core.errors import ConfigError
from transports.auth import HostKeys, generate

ROOT = Path(__file__).resolve().parents[2]
BASE = [
    "cluster.tp=1",
    "cluster.training_gpus=8-9",
    "cluster.reserved_gpus=0-1",
    "cluster.preemptible_gpus=2-7",
    "daemon.borrow=never",
    "daemon.launcher=ray",
]


def cfg(*extra: str) -> config.Config:
    return config.load(None, [*BASE, *extra])


def node(nid: str, gpus: int, label: str = "", alive: bool = True, **kw: object) -> RayNode:
    return RayNode(
        node_id=nid,
        address=f"10.0.0.{nid}",
        alive=alive,
        gpus=gpus,
        labels={"pearl-gpus": label} if label else {},
        **kw,
    )  # type: ignore[arg-type]


A, B, C = node("1", 2, "0-1"), node("2", 2, "2-3"), node("3", 4, "4-7")


def test_labels_and_config_entries_say_which_node_holds_which_gpu() -> None:
    c = cfg()
    got = placement(c, [A, B, C])
    assert {g: (n.node_id, local) for g, (n, local) in got.items()} == {
        0: ("1", 0), 1: ("1", 1), 2: ("2", 0), 3: ("2", 1),
        4: ("3", 0), 5: ("3", 1), 6: ("3", 2), 7: ("3", 3),
    }  # fmt: skip
    assert held(c, node("4", 2, "2_5")) == (2, 5)  # Ray's label values hold no comma
    # An entry wins over the node's label; it may match the address, the id or a label.
    entries = config.load(
        None,
        [
            *BASE,
            'cluster.nodes=[{address = "10.0.0.1", gpus = "0-1"}, {node_id = "2", gpus = "2-3"},'
            ' {label = "rack=r7", gpus = "4-5"}]',
        ],
    )
    r7 = RayNode(
        node_id="9",
        address="10.0.0.9",
        alive=True,
        gpus=2,
        labels={"rack": "r7", "pearl-gpus": "6-7"},
    )
    assert [held(entries, n) for n in (A, B, r7)] == [(0, 1), (2, 3), (4, 5)]
    assert placement(c, [A, node("2", 2, "2-3", alive=False)]).keys() == {0, 1}


@pytest.mark.parametrize(
    "nodes, extra, words",
    [
        ([node("1", 1, "0-1")], (), "holds 1 GPU(s) but is given 2 (0-1)"),
        ([A, node("2", 2, "1-2")], (), "GPU 1 is held by two Ray nodes"),
        (
            [node("2", 2, "2-3")],
            (),
            "GPUs 0-1 (cluster.reserved_gpus) are held by no live Ray node",
        ),
        ([A], ("cluster.initial_preemptible=2-3",), "GPUs 2-3 (cluster.initial_preemptible)"),
        ([A], ("daemon.borrow=gated",), "GPUs 8-9 (cluster.training_gpus)"),
        (
            [A],
            ('cluster.nodes=[{address = "10.0.0.5", gpus = "0-1"}]',),
            "cluster.nodes[0] (10.0.0.5, GPUs 0-1) matches no live Ray node",
        ),
    ],
)
def test_a_cluster_that_cannot_run_the_config_is_one_line(
    nodes: list[RayNode], extra: tuple[str, ...], words: str
) -> None:
    with pytest.raises(ConfigError) as e:
        check_placement(cfg(*extra), nodes)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_node_changes_are_the_events_a_cli_sends() -> None:
    c = cfg()
    now = {n.node_id: n for n in (A, B)}
    # First look: live preemptible GPUs not present are added; a gone node's present ones leave.
    assert node_events(c, None, now, present={0, 1}, leaving=set(), wall=100.0) == [
        ev.GpusAdded(gpus=(2, 3))
    ]
    dead_c = {**now, "3": node("3", 4, "4-7", alive=False)}
    assert node_events(c, None, dead_c, present={0, 1, 2, 3, 4, 5}, leaving=set(), wall=1.0) == [
        ev.GpusReclaimed(gpus=(4, 5))
    ]
    # Later looks: edges only.
    assert node_events(c, now, now, present={0, 1, 2, 3}, leaving=set(), wall=1.0) == []
    joined = {**now, "3": C}
    assert node_events(c, now, joined, present={0, 1, 2, 3}, leaving=set(), wall=1.0) == [
        ev.GpusAdded(gpus=(4, 5, 6, 7))
    ]
    died = {"1": A, "2": node("2", 2, "2-3", alive=False)}
    assert node_events(c, now, died, present={0, 1, 2, 3}, leaving=set(), wall=1.0) == [
        ev.GpusReclaimed(gpus=(2, 3))
    ]
    gone = {"1": A}  # vanished from the table: dead too
    assert node_events(c, now, gone, present={0, 1, 2, 3}, leaving=set(), wall=1.0) == [
        ev.GpusReclaimed(gpus=(2, 3))
    ]
    # The reserved node dying is a host loss, not a reclaim.
    assert node_events(c, now, {"2": B}, present={0, 1, 2, 3}, leaving=set(), wall=1.0) == []
    # A drain with a deadline is a preemption notice; without one, a reclaim now; seen once.
    draining = {"1": A, "2": node("2", 2, "2-3", drain_deadline=160.0)}
    notice = node_events(c, now, draining, present={0, 1, 2, 3}, leaving=set(), wall=100.0)
    assert notice == [ev.GpusReclaiming(gpus=(2, 3), deadline=160.0)]
    assert (
        node_events(
            cfg=c, before=draining, now=draining, present={0, 1, 2, 3}, leaving={2, 3}, wall=101.0
        )
        == []
    )
    no_deadline = {"1": A, "2": node("2", 2, "2-3", drain_deadline=0.0)}
    assert node_events(
        cfg=c, before=now, now=no_deadline, present={0, 1, 2, 3}, leaving=set(), wall=100.0
    ) == [ev.GpusReclaimed(gpus=(2, 3))]


def test_the_hosts_keys_travel_as_text(tmp_path: Path) -> None:
    generate(tmp_path / "keys")
    keys = HostKeys.load(tmp_path / "keys")
    assert HostKeys.of_text(keys.to_text()) == keys
    with pytest.raises(ConfigError, match="expected public, secret and server"):
        HostKeys.of_text({"public": "x"})


def test_nodes_in_the_config_are_checked() -> None:
    with pytest.raises(ConfigError, match="exactly one of address, node_id or label"):
        cfg('cluster.nodes=[{gpus = "0-1"}]')
    with pytest.raises(ConfigError, match="GPU 1 is held by cluster.nodes"):
        cfg('cluster.nodes=[{label = "a=1", gpus = "0-1"}, {label = "a=2", gpus = "1-2"}]')
    with pytest.raises(
        ConfigError, match="cluster.nodes\\[0\\]: unknown key lable; did you mean .label."
    ):
        cfg('cluster.nodes=[{lable = "a=1", gpus = "0-1"}]')
    shipped = config.load(ROOT / "configs" / "ray-4x8.toml")
    assert shipped.daemon.launcher == "ray" and len(shipped.cluster.nodes) == 4


def test_without_ray_installed_pearld_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pearl.daemon import Daemon

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    with pytest.raises(ConfigError) as e:
        Daemon(cfg(), tmp_path / "state", f"ipc://{tmp_path}/api.sock").start()
    assert "needs Ray, which is not installed" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "state").exists()


def test_pearld_imports_ray_only_for_the_ray_launcher() -> None:
    modules = "pearl.daemon, actors.api, actors.supervisor, actors.launcher, actors.ray_nodes"
    code = f"import sys, {modules}, actors.worker_host; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60).returncode == 0


def test_a_node_that_restarts_within_one_look_is_reclaimed_then_added() -> None:
    c = cfg()
    before = {"1": A, "2": B}
    restarted = {"1": A, "9": node("9", 2, "2-3")}  # B died; it came back under a new id
    assert node_events(c, before, restarted, present={0, 1, 2, 3}, leaving=set(), wall=1.0) == [
        ev.GpusReclaimed(gpus=(2, 3)),
        ev.GpusAdded(gpus=(2, 3)),
    ]


class Scheduler:
    """The ElasticScheduler as the watcher sees it: refuses what does not fit, and is
    unreachable for the first ``down`` asks."""

    name = names.SCHEDULER

    def __init__(self, down: int = 0, refuse: tuple[object, ...] = ()) -> None:
        self.down, self.refuse, self.got = down, refuse, []  # type: list[object]

    def tell(self, msg: object) -> None:
        raise AssertionError("node events are asked, so a refusal is heard")

    def ask(self, msg: object, timeout_s: float = 10.0) -> object:
        from actors.base import ActorUnavailable
        from pearl.core.errors import InvalidEvent
        from transports.protocol import Ack

        if self.down:
            self.down -= 1
            raise ActorUnavailable("actor orchestrator did not answer within 30s")
        if msg in self.refuse:
            raise InvalidEvent("GPU 2 is already present")
        self.got.append(msg)
        return Ack(seq=len(self.got))


def watcher(s: Scheduler, present: set[int]):  # type: ignore[no-untyped-def]
    from actors.base import Directory
    from actors.ray_nodes import RayNodeWatcher

    d = Directory()
    d.register(s)  # type: ignore[arg-type]
    w = RayNodeWatcher(d, cfg(), read=dict, clock=lambda: 100.0)  # never started: no poller
    w.before, w.present = {"1": A, "2": B}, set(present)
    return w


def test_the_watcher_keeps_what_it_could_not_deliver_and_sends_it_in_order() -> None:
    from actors.ray_nodes import NodesSeen

    s = Scheduler(down=1)
    w = watcher(s, {0, 1, 2, 3})
    restarted = {"1": A, "9": node("9", 2, "2-3")}
    w.seen(NodesSeen(restarted))  # pearld does not answer: nothing is lost
    assert s.got == [] and list(w.outbox) == [
        ev.GpusReclaimed(gpus=(2, 3)),
        ev.GpusAdded(gpus=(2, 3)),
    ]
    joined = {**restarted, "3": C}
    w.seen(NodesSeen(joined))  # the next look: the old events first, then the new one
    assert s.got == [
        ev.GpusReclaimed(gpus=(2, 3)),
        ev.GpusAdded(gpus=(2, 3)),
        ev.GpusAdded(gpus=(4, 5, 6, 7)),
    ]
    assert not w.outbox and w.present == {0, 1, 2, 3, 4, 5, 6, 7}
    w.seen(NodesSeen(joined))
    assert len(s.got) == 3  # delivered once


def test_the_watcher_drops_only_what_the_table_refuses_as_not_fitting() -> None:
    from actors.ray_nodes import NodesSeen

    s = Scheduler(refuse=(ev.GpusAdded(gpus=(4, 5, 6, 7)),))
    w = watcher(s, {0, 1, 2, 3})
    w.seen(NodesSeen({"1": A, "2": B, "3": C}))
    assert s.got == [] and not w.outbox  # already so in the table: nothing to retry
