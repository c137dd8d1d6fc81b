"""Many machines on Ray: pearld with ``daemon.launcher = "ray"`` on a simulated multi-node cluster.

One ``ray.cluster_utils.Cluster`` for the module: a head (pearld's node, no GPUs) and nodes A and
B, each declaring 2 fake GPUs and the table's GPUs it holds as a ``pearl-gpus`` label (A: 0-1,
reserved; B: 2-3, preemptible); a node C (4-5, preemptible) joins in one test. Worker hosts run
the sim engine (the torch one in the KV hand-off test). Every process the suite starts is
stopped by pid or through Ray, and the cluster is shut down at the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pearl
from actors import names
from actors.messages import Route
from pearl.core import events as ev
from pearl.core.errors import ConfigError
from pearl.core.status import status_plain
from pearl.engines.base import GenerateRequest, SamplingParams
from tests.daemon.conftest import CONFIG, ROOT, Pearld, wait_until

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")

pytestmark = pytest.mark.slow

NS = "pearl-test"
HEARTBEAT_S = 0.3
BASE = [
    "cluster.tp=1",
    "cluster.training_gpus=6-7",  # held by no node: never used with borrow = never
    "cluster.reserved_gpus=0-1",
    "cluster.preemptible_gpus=2-5",
    "engine.kind=sim",
    "engine.sim.time_scale=0.001",
    "engine.sim.start_s=1",
    f"daemon.heartbeat_s={HEARTBEAT_S}",
    "daemon.tick_s=0.1",
    "daemon.reconcile_grace_s=2.0",
    "daemon.restart_backoff_s=0.2",
    "daemon.worker_orphan_s=30",
    "daemon.borrow=never",
    "daemon.launcher=ray",
    f"ray.namespace={NS}",
    "ray.poll_s=0.2",
    # Priors under which 2 workers run colocated and 4 as 2P2D (pearl decide; 1P3D's prefill
    # pool would be 90% busy).
    "workload.batch=24",
    "workload.group_size=4",
    "workload.turn_overhead_s=2",
    "workload.new_tokens_per_turn=3000",
]


class Sim:
    def __init__(self, cluster: Any, a: Any, b: Any) -> None:
        self.cluster, self.a, self.b = cluster, a, b
        self.ip = ray.util.get_node_ip_address()

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def sets(self, *extra: str) -> list[str]:
        return [*BASE, f"ray.address={self.address}", *extra]


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    from ray.cluster_utils import Cluster

    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,
                # A lost node is declared dead in ~1 s, not Ray's default 15 s.
                "_system_config": {
                    "health_check_initial_delay_ms": 0,
                    "health_check_period_ms": 300,
                    "health_check_failure_threshold": 3,
                },
            },
        )
    except Exception as e:  # no Ray runtime here (ports, /dev/shm, ...): say why
        pytest.skip(f"a Ray cluster cannot start here: {e}")
    try:
        a = cluster.add_node(num_cpus=1, num_gpus=2, labels={"pearl-gpus": "0-1"})
        b = cluster.add_node(num_cpus=1, num_gpus=2, labels={"pearl-gpus": "2-3"})
        ray.init(
            address=cluster.address,
            namespace=NS,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
        yield Sim(cluster, a, b)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(autouse=True)
def no_hosts_left(sim: Sim) -> Iterator[None]:
    """Each test starts with no worker-host actor and stops every one it left."""
    yield
    for name in ray.util.list_named_actors():
        with contextlib.suppress(Exception):
            ray.kill(ray.get_actor(name, namespace=NS), no_restart=True)


def host_of(worker: int, incarnation: int) -> Any:
    return ray.get_actor(f"pearl-host-{worker}.{incarnation}", namespace=NS)


def node_of_gpu(sim: Sim, gpu: int) -> str:
    for n in ray.nodes():
        text = (n.get("Labels") or {}).get("pearl-gpus", "")
        lo, _, hi = text.partition("-")
        if n["Alive"] and text and int(lo) <= gpu <= int(hi or lo):
            return str(n["NodeID"])
    raise AssertionError(f"no live node holds GPU {gpu}")


def serving(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in status["workers"] if w["activity"] == "active" and w["role"] != "training"]


def settled(rt: Any, timeout: float = 60.0) -> dict[str, Any]:
    def calm() -> dict[str, Any] | None:
        s = status_plain(rt.status())
        return s if not s["transitions"] and not s["failed"] and s["plan"] is None else None

    return wait_until(calm, timeout, "pearld to settle", every=0.1)  # type: ignore[no-any-return]


def settled_with(rt: Any, n: int, timeout: float = 60.0) -> dict[str, Any]:
    """Settled with ``n`` workers serving."""

    def ready() -> dict[str, Any] | None:
        s = settled(rt, timeout)
        return s if len(serving(s)) == n else None

    return wait_until(ready, timeout, f"{n} workers serving", every=0.2)  # type: ignore[no-any-return]


class Sink:
    """Stands for an actor that routes requests: collects their generate-done."""

    name = "sink"

    def __init__(self) -> None:
        self.got: dict[str, Any] = {}

    def tell(self, msg: Any) -> None:
        self.got[msg.rid] = msg

    def ask(self, msg: Any, timeout_s: float = 10.0) -> Any:
        return None


def runtime(tmp: Path, *sets: str) -> Any:
    return pearl.Runtime.from_config(CONFIG, state_dir=tmp / "state", overrides=sets)


def test_hosts_run_on_their_gpus_nodes_and_a_re_role_plan_spans_nodes(
    sim: Sim, tmp_path: Path
) -> None:
    from transports.auth import generate

    generate(tmp_path / "keys")  # beyond loopback: CURVE, the hosts' keys handed over by Ray
    rt = runtime(
        tmp_path,
        *sim.sets(
            "daemon.pd=adaptive",
            f"daemon.endpoint=tcp://{sim.ip}:*",
            f"daemon.keys_dir={tmp_path / 'keys'}",
        ),
    )
    try:
        rt.start()
        s = settled(rt)
        assert [w["role"] for w in serving(s)] == ["colocated"] * 2
        seq = rt.event(ev.GpusAdded(gpus=(2, 3)))  # node B's GPUs: 2 -> 4 workers, a mode switch
        s = settled_with(rt, 4)
        roles = {w["id"]: w["role"] for w in serving(s)}
        assert sorted(roles.values()) == ["decode", "decode", "prefill", "prefill"], roles
        nodes = rt.daemon.board.nodes()
        for w in serving(s):  # each host said hello from the node that holds its GPU
            assert nodes[w["id"]] == node_of_gpu(sim, w["gpus"][0]), (w, nodes)
        a, b = node_of_gpu(sim, 0), node_of_gpu(sim, 2)
        assert {nodes[w] for w in roles} == {a, b}
        records = [r for q, r in rt.daemon.event_log.read(seq)]
        changed = {r.worker for r in records if isinstance(r, ev.RoleChanged)}
        on_a = {w for w in roles if nodes[w] == a}
        assert on_a <= changed, (on_a, records)  # the survivors on node A were re-roled
        # Prefill on one node, decode on the other: requests cross nodes and complete.
        by_role = {r: {nodes[w] for w, x in roles.items() if x == r} for r in set(roles.values())}
        print(f"roles {roles}, prefill on {by_role['prefill']}, decode on {by_role['decode']}")
        sink = Sink()
        rt.daemon.directory.register(sink)
        for i in range(8):
            request = GenerateRequest(
                rid=f"x{i}", input_ids=(1, 2, 3, 4), sampling=SamplingParams(max_new_tokens=4)
            )
            rt.daemon.directory.tell(names.ROUTER, Route(request=request, reply_to="sink"))
        wait_until(lambda: len(sink.got) == 8, 30, "8 requests answered")
        assert all(d.result is not None and not d.error for d in sink.got.values()), sink.got
    finally:
        rt.stop()


def test_a_kv_hand_off_between_torch_hosts_on_two_nodes(sim: Sim, tmp_path: Path) -> None:
    from transports.auth import generate

    generate(tmp_path / "keys")
    rt = runtime(
        tmp_path,
        *sim.sets(
            "cluster.reserved_gpus=1-2",  # GPU 1 on node A, GPU 2 on node B
            "cluster.preemptible_gpus=3-5",
            "engine.kind=torch",
            "engine.torch.preset=tiny",
            "engine.torch.kv_budget_mb=16",
            "model.name=qwen3-tiny",
            "cluster.gpu=CPU",
            "daemon.pd=disaggregated",
            "daemon.heartbeat_s=0.5",  # torch's imports hold the interpreter at start
            f"daemon.endpoint=tcp://{sim.ip}:*",
            f"daemon.keys_dir={tmp_path / 'keys'}",
        ),
    )
    try:
        rt.start()
        s = settled_with(rt, 2, timeout=120)
        roles = {w["gpus"][0]: w["role"] for w in serving(s)}
        assert sorted(roles.values()) == ["decode", "prefill"], roles
        nodes = rt.daemon.board.nodes()
        placed = {w["gpus"][0]: nodes[w["id"]] for w in serving(s)}
        assert placed == {1: node_of_gpu(sim, 1), 2: node_of_gpu(sim, 2)} and placed[1] != placed[2]
        sink = Sink()
        rt.daemon.directory.register(sink)
        prompt = tuple(range(5, 40))  # prefilled on one node, its KV decoded on the other
        request = GenerateRequest(
            rid="kv", input_ids=prompt, sampling=SamplingParams(max_new_tokens=6, temperature=0.0)
        )
        rt.daemon.directory.tell(names.ROUTER, Route(request=request, reply_to="sink"))
        done = wait_until(lambda: sink.got.get("kv"), 60, "the request to be answered")
        assert not done.error and done.result is not None, done
        assert done.result.prompt_tokens == len(prompt) and len(done.result.output_ids) == 6
    finally:
        rt.stop()


def test_pearld_sigkilled_and_restarted_adopts_the_ray_hosts(sim: Sim, tmp_path: Path) -> None:
    d = Pearld(tmp_path, sim.sets("cluster.initial_preemptible=2-3", "daemon.pd=colocated"))
    try:
        d.start(timeout=60)
        s = wait_until(lambda: (x := d.settled(60)) and len(serving(x)) == 4 and x, 60, "4 workers")
        before = {(w["id"], w["incarnation"]) for w in serving(s)}
        where = {k: ray.get(host_of(*k).where.remote(), timeout=10) for k in before}
        assert {n for n, _ in where.values()} == {node_of_gpu(sim, 0), node_of_gpu(sim, 2)}
        d.kill9()
        d.start(timeout=60)
        # No event: a host pearld lost would be declared dead after missed heartbeats; wait that.
        time.sleep(6 * HEARTBEAT_S)
        s = d.settled(60)
        assert {(w["id"], w["incarnation"]) for w in serving(s)} == before
        after = {k: ray.get(host_of(*k).where.remote(), timeout=10) for k in before}
        assert after == where  # the same actors, the same host processes: not restarted
        assert sorted(ray.util.list_named_actors()) == sorted(
            f"pearl-host-{w}.{i}" for w, i in before
        )
        assert sorted(s["worker_nodes"].items()) == sorted(
            (str(w), where[w, i][0]) for w, i in before
        )
    finally:
        d.cleanup()
    wait_until(lambda: not ray.util.list_named_actors(), 20, "pearld to stop its hosts")


def test_bad_ray_input_is_one_line_and_nothing_is_logged_or_launched(
    sim: Sim, tmp_path: Path
) -> None:
    from pearl import config
    from pearl.daemon import Daemon
    from tests.daemon.test_startup import run_failing, the_problem

    # An unreachable address: pearld exits at once with one line.
    d = Pearld(tmp_path / "a", sim.sets("ray.address=127.0.0.1:9"))
    rc, took, err = run_failing(d.command(f"ipc://{tmp_path}/a.sock"))
    line = the_problem(err)
    assert rc != 0 and "ray.address = '127.0.0.1:9'" in line and "ray start" in line, line
    assert not d.state.exists()

    cases = {
        "cluster.initial_preemptible=2-5": "GPUs 4-5 (cluster.initial_preemptible) are held by no",
        'cluster.nodes=[{label = "pearl-gpus=0-1", gpus = "0-3"}]': "holds 2 GPU(s) but is given 4",
    }
    for k, (extra, words) in enumerate(cases.items()):
        state = tmp_path / f"s{k}"
        cfg = config.load(CONFIG, sim.sets(extra))
        with pytest.raises(ConfigError) as e:
            Daemon(cfg, state, f"ipc://{tmp_path}/s{k}.sock").start()
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
        assert not state.exists()  # nothing logged
        assert not ray.util.list_named_actors()  # nothing launched


def test_node_loss_and_arrival_are_elastic_events(
    sim: Sim, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Node B dies while rollouts run: its hosts are noticed within 3 heartbeats, its GPUs leave
    the table through a logged gpus-reclaimed, no trajectory is lost, status == replay. Node C
    joins: its GPUs come in through a logged gpus-added; drained with a deadline, they get a
    logged preemption notice. (B's GPUs came in the same way at start: node events reconcile the
    table with the live nodes.)"""
    from pearl.log import FileLog

    caplog.set_level(logging.INFO, logger="actors")
    rt = pearl.Runtime.from_config(
        ROOT / "configs" / "local-cpu.toml",
        state_dir=tmp_path / "state",
        overrides=[
            *sim.sets("ray.node_events=true", "cluster.initial_preemptible="),
            "engine.sim.time_scale=0.2",
            "daemon.pd=colocated",
            "workload.batch=8",
            "workload.group_size=4",
            "rl.max_turns=2",
            "rl.max_new_tokens=16",
        ],
    )
    c_node = None
    try:
        rt.start()
        settled_with(rt, 4)
        first = [r for _, r in rt.daemon.event_log.read() if isinstance(r, ev.GpusAdded)]
        assert first == [ev.GpusAdded(gpus=(2, 3))]  # node B, found live at start
        pipeline = rt.daemon.batches()
        ids = {t.id for _ in range(2) for t in rt.next_batch(timeout_s=60)}

        on_b = {
            k: ray.get(host_of(*k).where.remote(), timeout=10)[1]
            for k in ((w["id"], w["incarnation"]) for w in serving(status_plain(rt.status())))
            if k[0]
            in {w["id"] for w in serving(status_plain(rt.status())) if w["gpus"][0] in (2, 3)}
        }
        assert len(on_b) == 2
        t0 = time.monotonic()
        sim.cluster.remove_node(sim.b, allow_graceful=False)
        for pid in on_b.values():  # a lost machine takes its processes; remove_node only Ray's
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(  # declared dead (or stopped by the reclaim): no longer counted on
            lambda: not {w for w, _ in on_b} & set(rt.daemon.board.nodes()), 10, "B's hosts gone"
        )
        noticed = time.monotonic() - t0
        assert noticed <= 3 * HEARTBEAT_S + 1.0, noticed  # 3 heartbeats, a tick, a loaded box
        s = settled_with(rt, 2)
        assert not {2, 3} & set(s["gpus"]["present"]), s["gpus"]
        assert all(not {2, 3} & set(w["gpus"]) for w in s["workers"])
        logged = [r for _, r in rt.daemon.event_log.read() if isinstance(r, ev.GpusReclaimed)]
        assert logged == [ev.GpusReclaimed(gpus=(2, 3))]
        for _ in range(2):  # the rollouts go on; the prefixes of lost turns were resubmitted
            batch = rt.next_batch(timeout_s=60)
            assert all(t.done for t in batch)
            ids |= {t.id for t in batch}
        assert pipeline.failed == 0 and pipeline.counts["failed"] == 0, pipeline.counts
        assert len(ids) == 4 * 8
        status = status_plain(rt.status())
        with FileLog(tmp_path / "state" / "log", readonly=True) as log:
            replayed = log.load(status["seq"]).state.to_json()
        assert (status["seq"], status["workers"]) == (replayed["seq"], replayed["workers"])
        print(f"node B's hosts noticed dead {noticed:.2f}s after it was removed")

        c_node = sim.cluster.add_node(num_cpus=1, num_gpus=2, labels={"pearl-gpus": "4-5"})
        s = settled_with(rt, 4)
        added = [r for _, r in rt.daemon.event_log.read() if isinstance(r, ev.GpusAdded)]
        assert added == [ev.GpusAdded(gpus=(2, 3)), ev.GpusAdded(gpus=(4, 5))]
        nodes = rt.daemon.board.nodes()
        assert {nodes[w["id"]] for w in serving(s) if w["gpus"][0] >= 4} == {c_node.node_id}
        assert any("gpus-added 4-5 logged" in r.getMessage() for r in caplog.records)

        # Ray's drain API with a deadline (what the autoscaler does before a preemption): the
        # preemption notice, logged.
        from ray.core.generated import autoscaler_pb2

        deadline = time.time() + 60
        gcs = ray._raylet.GcsClient(address=sim.address)
        accepted, why = gcs.drain_node(
            c_node.node_id,
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "spot instance reclaimed",
            int(deadline * 1000),
        )
        assert accepted, why
        notice = wait_until(
            lambda: [r for _, r in rt.daemon.event_log.read() if isinstance(r, ev.GpusReclaiming)],
            10,
            "a logged gpus-reclaiming",
        )
        assert notice == [ev.GpusReclaiming(gpus=(4, 5), deadline=int(deadline * 1000) / 1000)]
    finally:
        rt.stop()
        if c_node is not None:
            sim.cluster.remove_node(c_node, allow_graceful=False)
