"""Chaos run: random elastic events and training cycles against pearld while its worker hosts are
SIGKILLed and SIGSTOPped, pearld itself is SIGKILLed, its log disk fills (or fails its syncs) for
a few seconds, and its metrics port is flooded with idle connections (issues 21 and 35). Agents
chat through pearld's gateway all along, while it is sent poison requests, held by slow clients
and left by clients that hang up (issue 41; :mod:`gateway_faults`). A killed vLLM server is not
among the faults (the run uses sim engines): tests/engines/vllm covers it.

A Python client (``pearl.connect``) plays the world's gpus-added / gpus-reclaimed of the
preemptible range (sometimes a reclaim and the re-grant of the same GPUs at once), each a fact
retried until acknowledged, and training cycles (Training Begin, wait until it may proceed,
weights published, Training Finished; sometimes a reclaim right after, the storm's sequence)
against pearld on ``configs/sim-32.toml`` (sim engines, loopback TCP). Beside it, :mod:`faults`
injects the faults above, restarting pearld on the same state dir after a kill. Bounded in count
and time; every process the run started is stopped by pid at the end, also on Ctrl-C or SIGTERM.

Reported (``--json``): ``cycles``; Training Begin -> may proceed (median, max) for returns no
fault came near (``return_max_s``, the figure the <= 3.2 s target is about) and for the others;
``orchestrator_restarts`` (unplanned: pearld's "restarting actor orchestrator"; a pearld the run
killed starts afresh and logs none); ``false_deaths`` (hosts declared dead for missed heartbeats
that the run did not kill or stop); ``events_lost`` (acknowledged events, and uploaded weight
versions, missing from the log after a pearld kill, after its restart or at the end);
``facts_refused`` (the world's GPU changes pearld refused); ``reported_failed_but_durable``
(events pearld answered with an error that the log holds anyway); ``world_equals_table``;
``metrics_flood_connections_max`` (connections, one thread each, pearld's metrics endpoint said
it served while 1,000 idle ones were held; ``metrics_flood_threads_max``: pearld's thread count
then, less before, which worker churn also moves);
``replay_equal`` (``pearl status --json`` == ``pearl log replay DIR --until SEQ --json`` at the
end); ``requests_failed`` (the agents' chat requests that failed although pearld was up
throughout: ``requests_excused`` crossed a pearld kill), ``poison_not_4xx`` and the slow clients'
figures. Targets (10 minutes): 0 lost, restarts, facts refused, failed-but-durable, requests
failed, poison not refused; status == replay; 0 false deaths; at most +64 threads under a flood.

    .venv/bin/python benchmarks/chaos.py [--minutes 10] [--seed 1] [--json FILE] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gateway_faults as gw  # noqa: E402
import live_pearld as live  # noqa: E402
from faults import Fault, Injector, Limits  # noqa: E402
from live_pearld import (  # noqa: E402
    PREEMPTIBLE,
    Pearld,
    Trainer,
    lost_events,
    overlap_serving,
    pearl_cli,
    poll,
    safetensors_blob,
    status_vs_replay,
    summary,
)

from actors import names  # noqa: E402
from pearl.core import events as ev  # noqa: E402
from pearl.log.failpoints import DISK_ENV  # noqa: E402

TARGET_RETURN_S = 3.2
NEAR_S = {
    "kill-host": 10.0,
    "stop-host": 10.0,
    "kill-pearld": 15.0,
    "pearld-exit": 15.0,
    "disk-full": 5.0,  # a training-begin refused meanwhile is retried after the window
    "metrics-flood": 5.0,
    # The gateway's faults run from this process: opening 1,500 connections costs it CPU.
    "poison": 1.0,
    "slow-clients": 5.0,
    "abandon": 1.0,
}
MAX_PRESENT = 8  # preemptible GPUs present at most: bounds the hosts on a small machine
QUIET_TAIL_S = 10.0  # no new fault this close to the end


class Play:
    """The world and the trainer: one elastic event or training cycle at a time.

    The GPU changes are the world's, kept in :attr:`world` (the preemptible GPUs granted now),
    not read back from pearld: a reclaim and a re-grant of the same GPUs can follow each other
    at once (a node that restarts within one poll), whatever pearld's workers are doing. Each
    is a fact: sent until pearld acknowledges it, also through disk-full windows and pearld
    restarts; a refusal that is not a duplicate of an unanswered attempt counts in
    :attr:`facts_refused`."""

    def __init__(self, t: Trainer, rng: random.Random, world: set[int]) -> None:
        self.t, self.rng = t, rng
        self.world = set(world)
        self.blob = safetensors_blob()
        self.published: set[int] = set()
        self.returns: list[dict[str, Any]] = []  # Training Begin -> may proceed, one per cycle
        self.cycles = 0
        self.events: dict[str, int] = {}
        self.facts_refused: list[str] = []
        self.disk_refusals = 0  # events refused while pearld's disk refused writes (retried)
        self.flaps = 0  # reclaims followed at once by the re-grant of the same GPUs

    def send(self, record: Any) -> int | None:
        self.events[record.KIND] = self.events.get(record.KIND, 0) + 1
        seq = self.t.event(record)
        if seq is None and "LogWriteFailed" in self.t.last_refusal:
            self.disk_refusals += 1
        return seq

    def fact(self, record: Any, patience_s: float = 90.0) -> bool:
        """Deliver a fact: retried while pearld is down or its disk refuses writes, never
        dropped for that. False only when pearld refused it as not fitting."""
        unanswered = False
        deadline = time.monotonic() + patience_s
        while time.monotonic() < deadline:
            if self.send(record) is not None:
                return True
            refusal = self.t.last_refusal
            if refusal and "LogWriteFailed" not in refusal and "LogError" not in refusal:
                if not unanswered:  # else a duplicate of an attempt that may have been logged
                    self.facts_refused.append(f"{record}: {refusal[:160]}")
                return False
            unanswered = unanswered or not refusal
            time.sleep(0.05)
        self.facts_refused.append(f"{record}: not delivered in {patience_s:.0f}s")
        return False

    def step(self) -> None:
        try:
            s = self.t.status()
        except Exception:
            time.sleep(0.1)  # pearld down (on purpose or not): the injector brings it back
            return
        if s["phase"] == "training":  # a cycle cut short by a kill: finish it
            k = s["training_step"]
            may = s["training_may_proceed"] >= k or self.t.wait_proceed(k, 60.0) is not None
            if may and self.send(ev.TrainingFinished(step=k)) is None:
                time.sleep(0.05)  # refused (a disk-full window): the next step tries again
            return
        present = sorted(self.world)
        absent = [
            p
            for p in zip(PREEMPTIBLE[::2], PREEMPTIBLE[1::2], strict=True)
            if not self.world & set(p)
        ]
        options = [("cycle", 3.0)]
        if absent and len(present) < MAX_PRESENT:
            options.append(("add", 1.2))
        if present:
            options += [("reclaim", 1.0), ("flap", 0.6)]
        what = self.rng.choices([o for o, _ in options], [w for _, w in options])[0]
        if what == "add":
            n = self.rng.choice((1, 1, 2))
            gpus = tuple(sorted(g for p in self.rng.sample(absent, min(n, len(absent))) for g in p))
            self.world |= set(gpus)
            self.fact(ev.GpusAdded(gpus=gpus))
        elif what == "reclaim":
            gone = self._some(present)
            self.world -= set(gone)
            self.fact(ev.GpusReclaimed(gpus=gone))
        elif what == "flap":  # gone and back within one look of an event source
            gpus = self._some(present)
            self.world -= set(gpus)
            self.fact(ev.GpusReclaimed(gpus=gpus))
            self.world |= set(gpus)
            self.fact(ev.GpusAdded(gpus=gpus))
            self.flaps += 1
        else:
            self.cycle(s["training_step"] + 1, present)
        time.sleep(self.rng.uniform(0.0, 0.3))

    def _some(self, present: list[int]) -> tuple[int, ...]:
        if self.rng.random() < 0.3:
            return (self.rng.choice(present),)
        pairs = sorted({g - g % 2 for g in present})
        first = self.rng.choice(pairs)
        return tuple(g for g in (first, first + 1) if g in present)

    def cycle(self, k: int, present: list[int]) -> None:
        t0 = time.monotonic()
        if self.send(ev.TrainingBegin(step=k)) is None:
            return
        waited = self.t.wait_proceed(k, 90.0)
        t1 = time.monotonic()
        self.returns.append({"step": k, "t0": t0, "t1": t1, "ok": waited is not None})
        if waited is None:
            return
        time.sleep(self.rng.uniform(0.05, 0.6))  # "training"
        version = None
        if self.rng.random() < 0.5 and self.t.publish(k, self.blob):
            self.published.add(k)
            version = k
        if self.send(ev.TrainingFinished(step=k, weights_version=version)) is None:
            return
        self.cycles += 1
        if self.world and self.rng.random() < 0.4:  # the storm's sequence: reclaim during lending
            gone = self._some(sorted(self.world))
            self.world -= set(gone)
            self.fact(ev.GpusReclaimed(gpus=gone))
            if self.rng.random() < 0.6:
                poll(lambda: self._lending(), 10.0, 0.01)
                self.cycle(k + 1, [])

    def _lending(self) -> bool:
        try:
            return overlap_serving(self.t.status())
        except Exception:
            return False


def near(r: dict[str, Any], faults: list[Fault]) -> list[str]:
    """The faults that came within reach of a return: during it or shortly before."""
    return sorted(
        {f.kind for f in faults if f.t <= r["t1"] and max(f.end, f.t) + NEAR_S[f.kind] >= r["t0"]}
    )


def deaths(down: list[dict[str, Any]], faults: list[Fault]) -> dict[str, Any]:
    """Hosts pearld declared down, split by whether the run's own faults explain them."""
    pids = {f.pid for f in faults if f.pid}
    hit = {f.worker for f in faults if f.worker is not None}
    false, unexplained, caused = [], [], 0
    for x in down:
        # A host relaunched after a pearld restart is logged with pid 0: judge it by worker.
        if x["pid"] in pids or (x["pid"] == 0 and x["worker"] in hit):
            caused += 1
        elif x["why"] == "missed heartbeats":
            false.append(x)
        else:
            unexplained.append(x)
    return {"caused": caused, "false": false, "unexplained": unexplained}


def settle(t: Trainer, timeout: float, seen: dict[str, Any]) -> bool:
    """Until nothing is in flight, ending the training step pearld lets proceed; ``seen`` keeps
    the last status's unsettled part."""

    def calm() -> bool:
        try:
            s = t.status()
        except Exception as e:
            seen.update(error=str(e))
            return False
        keys = ("phase", "training_step", "training_may_proceed", "transitions", "plan", "failed")
        seen.update({k: s.get(k) for k in keys}, reclaiming=s["gpus"]["reclaiming"])
        if s["phase"] == "training":
            if s["training_may_proceed"] >= s["training_step"]:
                t.event(ev.TrainingFinished(step=s["training_step"]))
            return False
        return not (s["transitions"] or s["plan"] or s["gpus"]["reclaiming"] or s["failed"])

    return bool(poll(calm, timeout, 0.1))


def hosts_vs_table(d: Pearld, s: dict[str, Any]) -> dict[str, Any]:
    """Worker host processes against the table: two hosts for one worker, hosts of no worker,
    active workers without a host."""
    rows = {w["id"]: w for w in s["workers"] if w["role"] != "training"}
    by_worker: dict[int, list[int]] = {}
    for h in d.hosts():
        by_worker.setdefault(h.worker, []).append(h.pid)
    return {
        "duplicate_hosts": {w: p for w, p in by_worker.items() if len(p) > 1},
        "orphan_hosts": {w: p for w, p in by_worker.items() if w not in rows},
        "missing_hosts": sorted(
            w for w, r in rows.items() if r["activity"] != "inactive" and w not in by_worker
        ),
    }


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    port = live.free_port()
    gateway_port = live.free_port()
    (tmp / "gateway.key").write_text(gw.KEY)
    gateway = [
        f"gateway.listen=127.0.0.1:{gateway_port}",
        f"gateway.api_key_file={tmp / 'gateway.key'}",
        f"gateway.model={gw.MODEL}",
    ]
    url = f"http://127.0.0.1:{gateway_port}"
    d = Pearld(
        tmp,
        [f"daemon.metrics=127.0.0.1:{port}", *gateway, *args.set],
        port=live.free_port(),
        metrics_port=port,
        env={DISK_ENV: str(tmp / "disk-full")},  # the injector's disk-full windows
    )
    t0 = time.monotonic()
    end = t0 + args.minutes * 60.0
    out: dict[str, Any] = {
        "benchmark": "chaos",
        "minutes": args.minutes,
        "seed": args.seed,
        "config": str(d.config),
        "sets": list(args.set),
    }
    inj: Injector | None = None
    t: Trainer | None = None
    agents: gw.Agents | None = None
    try:
        print(f"pearld up in {d.start():.1f}s at {d.endpoint} (state {d.state})", flush=True)
        t = Trainer(d.endpoint)
        world = {g for g in t.status()["gpus"]["present"] if g in PREEMPTIBLE}
        play = Play(t, random.Random(rng.random()), world)
        m = max(args.minutes, 1.0)
        lim = Limits(
            max_kill_host=int(3 * m),
            max_stop_host=int(3 * m),
            max_kill_pearld=max(1, int(0.8 * m)),
            max_disk_full=max(1, int(2 * m)),
            max_metrics_flood=max(1, int(0.6 * m)),
            max_poison=max(1, int(2 * m)),
            max_slow_clients=max(1, int(0.8 * m)),
            max_abandon=max(1, int(1.5 * m)),
        )
        trainer = t
        inj = Injector(
            d,
            random.Random(rng.random()),
            lambda: trainer.acked,
            lambda: play.published,
            end - QUIET_TAIL_S,
            lim,
            gateway_url=url,
        )
        agents = gw.Agents(url, args.agents, random.Random(rng.random()))
        agents.start()
        inj.start()
        last = 0.0
        while time.monotonic() < end:
            play.step()
            if time.monotonic() - last >= 10.0:
                last = time.monotonic()
                ok = [r["t1"] - r["t0"] for r in play.returns if r["ok"]]
                stats = d.log_stats()
                print(
                    f"{last - t0:6.0f}s cycles {play.cycles:>4} return max "
                    f"{max(ok, default=0):6.2f}s acked {len(t.acked):>5} faults "
                    f"{len(inj.faults):>3} pearld starts {d.starts} orchestrator restarts "
                    f"{stats['restarts'].get('orchestrator', 0)} lost {len(inj.lost)}",
                    flush=True,
                )
        inj.stop()
        agents.stop()
        print("quiet: SIGCONT sent, settling", flush=True)
        if not d.running():
            d.start()
        unsettled: dict[str, Any] = {}
        settled = settle(t, 120.0, unsettled)
        out["unsettled"] = {} if settled else unsettled
        time.sleep(3.0)  # hosts being retired finish exiting
        out.update(report(d=d, t=t, play=play, inj=inj, t0=t0, settled=settled))
        out.update(gateway_report(agents, inj))
        # SIGTERM stops pearld "and its worker hosts": also the ones it adopted after a restart?
        out["pearld_exit_code"] = d.stop()
        poll(lambda: not d.hosts(), 10.0, 0.2)
        out["hosts_left_after_sigterm"] = sorted(f"{h.worker}/{h.pid}" for h in d.hosts())
    finally:
        if inj is not None:
            inj.stop()
        if agents is not None:
            agents.stop()
        if t is not None:
            t.close()
        d.cleanup()
    return out


def report(
    d: Pearld, t: Trainer, play: Play, inj: Injector, t0: float, settled: bool
) -> dict[str, Any]:
    lost = set(inj.lost) | {f"{x} (end)" for x in lost_events(d.state, t.acked, play.published)}
    equal, diff = status_vs_replay(d)
    s = t.status()
    stats = d.log_stats()
    dead = deaths(stats["down"], inj.faults)
    clean, faulted, returns = [], [], []
    for r in play.returns:
        kinds_near = near(r, inj.faults)
        took = r["t1"] - r["t0"]
        returns.append(
            {
                "step": r["step"],
                "at_s": round(r["t0"] - t0, 2),
                "return_s": round(took, 3) if r["ok"] else None,
                "near": kinds_near,
            }
        )
        if r["ok"]:
            (faulted if kinds_near else clean).append(took)
    verify = pearl_cli("log", "verify", str(d.state))  # non-zero on any damage
    kinds = ("kill-host", "stop-host", "kill-pearld", "pearld-exit", "disk-full", "metrics-flood",
             "poison", "slow-clients", "abandon")  # fmt: skip
    granted = set(s["gpus"]["present"]) | set(s["gpus"].get("regranted", []))
    return {
        "cycles": play.cycles,
        "returns_clean": summary(clean),
        "returns_near_fault": summary(faulted),
        "return_median_s": summary(clean)["median_s"],
        "return_max_s": summary(clean)["max_s"],
        "return_max_near_fault_s": summary(faulted)["max_s"],
        "return_timeouts": sum(not r["ok"] for r in play.returns),
        "target_return_s": TARGET_RETURN_S,
        "orchestrator_restarts": stats["restarts"].get(names.ORCHESTRATOR, 0),
        "actor_restarts": stats["restarts"],
        "actor_failures": stats["failures"][:20],
        "gave_up": stats["gave_up"],
        "controller_recoveries": s.get("controller_recoveries", 0),
        "controller_violations": stats["violations"][:20],
        "false_deaths": len(dead["false"]),
        "false_death_detail": dead["false"][:20],
        "unexplained_downs": dead["unexplained"][:20],
        "downs_caused": dead["caused"],
        "events_sent": play.events,
        "events_acked": len(t.acked),
        "events_unacked": t.unacked,
        "events_refused": t.refused,
        "weights_published": len(play.published),
        "facts_refused": len(play.facts_refused),
        "facts_refused_detail": play.facts_refused[:20],
        "reported_failed_but_durable": len(
            failed_durable := t.reported_failed_but_durable(d.state)
        ),
        "reported_failed_but_durable_detail": failed_durable[:20],
        "disk_refusals": play.disk_refusals,
        "flaps": play.flaps,
        "world_equals_table": {g for g in granted if g in PREEMPTIBLE} == play.world,
        "world_vs_table": {"world": sorted(play.world), "table": sorted(granted)},
        "metrics_flood_threads_max": max(inj.flood_threads, default=0),
        "metrics_flood_connections_max": max((n or 0 for n in inj.flood_served), default=0),
        "metrics_flood_scrapes_ok": all(n is not None for n in inj.flood_served),
        "events_lost": len(lost),
        "lost_detail": sorted(lost)[:20],
        "replay_equal": equal,
        "replay_diff": diff,
        "log_verified": verify.returncode == 0,
        "log_verify": (verify.stdout + verify.stderr).strip()[:300],
        "tables_invalid": inj.invalid,
        "settled": settled,
        "faults": {k: inj.count(k) for k in kinds},
        "fault_log": [f.as_json(t0) for f in inj.faults],
        "return_log": returns,
        "injector_errors": inj.errors[:20],
        "pearld_restart_s": summary(inj.restart_s),
        "pearld_alive": d.running(),
        **hosts_vs_table(d, s),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def gateway_report(agents: gw.Agents, inj: Injector) -> dict[str, Any]:
    """The agents' requests and the gateway faults: a failed request is excused only when its
    life crossed a window in which pearld was down on purpose (killed, then restarted)."""
    down = [(f.t, f.end) for f in inj.faults if f.kind in ("kill-pearld", "pearld-exit")]
    calls = agents.snapshot()
    failed = [c for c in calls if not c.ok]
    unexcused = [c for c in failed if not gw.excused(c, down)]
    return {
        "requests": len(calls),
        "requests_ok": sum(c.ok for c in calls),
        "requests_retried": sum(c.retries > 0 for c in calls),
        "requests_excused": len(failed) - len(unexcused),
        "requests_failed": len(unexcused),
        "requests_failed_detail": [
            {
                "session": c.session,
                "status": c.status,
                "error": c.error,
                "for_s": round(c.t1 - c.t0, 2),
            }
            for c in unexcused[:20]
        ],
        "poison_sent": inj.poison_sent,
        "poison_not_4xx": inj.poison_answers[:20],
        "slow_clients": inj.slow,
        "abandoned": inj.abandoned,
    }


def main() -> int:
    ap = live.parser(__doc__ or "")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--agents", type=int, default=4, help="chat sessions through the gateway")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleans up like Ctrl-C
    out = live.in_state_dir(args, "pearl-chaos-", run)
    print(
        f"chaos: {out['cycles']} cycles in {out['wall_s']:.0f}s; faults {out['faults']}; "
        f"return median {out['return_median_s']:.3f}s max {out['return_max_s']:.3f}s "
        f"(near a fault {out['return_max_near_fault_s']:.3f}s, target <= {TARGET_RETURN_S}s); "
        f"orchestrator restarts {out['orchestrator_restarts']}; false deaths "
        f"{out['false_deaths']}; events lost {out['events_lost']} of {out['events_acked']}; "
        f"facts refused {out['facts_refused']}; reported failed but durable "
        f"{out['reported_failed_but_durable']}; metrics flood "
        f"{out['metrics_flood_connections_max']} served (+{out['metrics_flood_threads_max']} "
        f"threads); status == replay {out['replay_equal']}; gateway requests "
        f"{out['requests_ok']}/{out['requests']} ok, {out['requests_failed']} failed "
        f"({out['requests_excused']} excused by a pearld kill), poison not 4xx "
        f"{len(out['poison_not_4xx'])} of {out['poison_sent']}, abandoned {out['abandoned']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
