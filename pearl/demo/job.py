"""The demo job's run: the trainer, the elastic events and the live line on a started runtime.

:func:`run` starts PEARL in this process, takes the training steps (:class:`Job`) while a Bamboo
segment or a scripted budget (``demo.budget``) moves the preemptible GPUs and :class:`LiveView`
prints a status line, then stops and writes the report (:func:`pearl.demo.app.write_report`).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pearl.core import events as ev
from pearl.core.errors import PearlError
from pearl.core.status import BorrowCycleStatus
from pearl.demo.app import (
    Sample,
    StepRecord,
    Timeline,
    borrow_record,
    count_cut_short,
    mode_switches,
    pipeline_counts,
    predict,
    predict_batch,
    returned_line,
    virtual_devices,
    write_report,
)
from pearl.demo.live import counts, live_line, starting_workers
from pearl.runtime import Runtime, RuntimeStats

if TYPE_CHECKING:
    from pearl.demo.learning import Learning, Prepared
    from pearl.rl.trajectory import Batch

LIVE_S = 1.0  # live view period
BATCH_TIMEOUT_S = 180.0  # no batch for this long: something is wrong, stop with a report


class Preemptible:
    """The preemptible GPUs present, moved to a wanted count by elastic events."""

    def __init__(self, rt: Runtime, timeline: Timeline) -> None:
        self.rt, self.timeline = rt, timeline
        self.ids = list(rt.cfg.cluster.preemptible_gpus)
        self.present: list[int] = []

    def move_to(self, want: int, why: str) -> None:
        try:
            if want > len(self.present):
                add = [g for g in self.ids if g not in self.present][: want - len(self.present)]
                self.rt.event(ev.GpusAdded(gpus=tuple(add)))
                self.present += add
                self.timeline.event(f"+{len(add)} preemptible ({why})")
            elif want < len(self.present):
                gone, self.present = self.present[want:], self.present[:want]
                self.rt.event(ev.GpusReclaimed(gpus=tuple(gone)))
                self.timeline.event(f"-{len(gone)} preemptible ({why})")
        except Exception as e:  # a refused event (e.g. still returning): try the next change
            self.timeline.event(f"event refused: {e}")


class TraceDriver(threading.Thread):
    """Replays a Bamboo segment, scaled to this config's preemptible ids and to ``seconds``."""

    def __init__(self, rt: Runtime, segment: str, seconds: float, timeline: Timeline) -> None:
        super().__init__(name="trace", daemon=True)
        from pearl.sim import availability

        self.pool = Preemptible(rt, timeline)
        self.trace = availability.load(segment_name=segment)
        self.scale = seconds / self.trace.duration_s
        self.halt = threading.Event()

    def target(self, gpus: int) -> int:
        """0-12 preemptible GPUs of the paper's cluster -> this cluster's preemptible ids."""
        return round(gpus * len(self.pool.ids) / 12)

    def run(self) -> None:
        t0 = time.monotonic()
        schedule = [(0.0, self.trace.at(0.0)), *self.trace.changes()]
        for t_trace, gpus in schedule:
            if self.halt.wait(max(0.0, t0 + t_trace * self.scale - time.monotonic())):
                return
            self.pool.move_to(self.target(gpus), f"trace {gpus}/12")


class BudgetScript:
    """``demo.budget``: the preemptible GPUs present from each training step on (a scripted
    budget, so that each interval holds whole steps)."""

    def __init__(self, rt: Runtime, timeline: Timeline, schedule: list[tuple[int, int]]) -> None:
        self.pool = Preemptible(rt, timeline)
        self.schedule = schedule

    def at(self, step: int) -> None:
        """Before ``step``'s batch is taken: apply the change scheduled for it, if any."""
        for s, n in self.schedule:
            if s == step:
                self.pool.move_to(n, f"budget from step {step}")

    def interval(self, step: int) -> int:
        """The preemptible GPUs the script asks for during ``step``."""
        n = 0
        for s, k in self.schedule:
            if s <= step:
                n = k
        return n


class LiveView(threading.Thread):
    """One status line a second (a line every 5 s when stdout is not a terminal)."""

    def __init__(
        self, rt: Runtime, timeline: Timeline, state: dict[str, Any], quiet: bool = False
    ) -> None:
        super().__init__(name="live", daemon=True)
        self.rt, self.timeline, self.state = rt, timeline, state
        self.halt = threading.Event()
        self.tty = sys.stdout.isatty()
        self.quiet = quiet
        self.engine = rt.cfg.engine.kind.value
        self.starting_since: float | None = None  # when the line first saw workers starting

    def run(self) -> None:
        n = 0
        while not self.halt.wait(LIVE_S):
            try:
                s = self.rt.status()
            except Exception:
                continue
            c = counts(s)
            t = time.monotonic() - self.timeline.t0
            with self.timeline.lock:
                self.timeline.samples.append(Sample.of(t, c, s.phase))
            if not starting_workers(s):
                self.starting_since = None
            elif self.starting_since is None:
                self.starting_since = t
            line = live_line(
                s,
                t=t,
                state=self.state,
                event=self.timeline.last_event(),
                engine=self.engine,
                starting_s=t - (self.starting_since or t),
            )
            n += 1
            if self.quiet:
                continue
            if self.tty:
                print("\r" + line.ljust(120), end="", flush=True)
            elif n % 5 == 0:
                print(line, flush=True)


class Job:
    """One demo run on a started runtime: the trainer, the elastic events (a Bamboo trace or a
    scripted budget), the live view, held-out evaluation, and a record per training step."""

    def __init__(
        self,
        rt: Runtime,
        timeline: Timeline,
        *,
        prepared: Prepared,
        learning: Learning | None,
        lr: float,
        segment: str | None,
        trace_s: float,
        quiet: bool,
    ) -> None:
        from pearl.config import parse_budget
        from pearl.demo import learning as learn
        from pearl.rl.grpo import GRPOTrainer

        self.rt, self.timeline, self.learning, self.quiet = rt, timeline, learning, quiet
        cfg = self.cfg = rt.cfg
        self.state: dict[str, Any] = {}  # what the live line shows of the steps
        self.records: list[StepRecord] = []
        self.training: list[tuple[float, float]] = []  # per record: Training Begin -> its end
        share = cfg.engine.torch.device_share  # the trainer holds all training slots on one thread
        self.trainer = GRPOTrainer(
            **learn.model_kwargs(cfg),
            lr=lr,
            device="cpu",
            device_share=None
            if share is None
            else min(1.0, share * len(cfg.cluster.training_gpus)),
        )
        schedule = parse_budget(cfg.demo.budget, len(cfg.cluster.preemptible_gpus))
        self.script = BudgetScript(rt, timeline, schedule) if schedule else None
        self.driver = TraceDriver(
            rt=rt, segment=segment or cfg.demo.segment, seconds=trace_s, timeline=timeline
        )
        self.live = LiveView(rt=rt, timeline=timeline, state=self.state, quiet=quiet)
        self.evals = learn.start_eval(cfg, prepared, learning)  # step 0: the starting policy

    def train(self, steps: int) -> bool:
        """Take ``steps`` training steps; True when cut short (Ctrl-C, or no rollout batch for
        ``BATCH_TIMEOUT_S``), the error already said."""
        try:
            if self.script is None:
                self.driver.start()
            self.live.start()
            last_end = time.monotonic()
            first = self.rt.status().training_step + 1  # a reused state dir continues
            for step in range(first, first + steps):
                last_end = self.step(step, since=last_end, last=first + steps - 1)
        except KeyboardInterrupt:
            print("\ninterrupted: stopping and writing the report", flush=True)
            return True
        except TimeoutError as e:
            print(f"\nno rollout batch: {e}; stopping and writing the report", flush=True)
            return True
        return False

    def step(self, step: int, *, since: float, last: int) -> float:
        """One step: the budget for it, its batch, training on it, its record and evaluation.
        ``since``: when the previous step ended. Returns when this one ended."""
        rt = self.rt
        if self.script is not None:
            self.script.pool.move_to(self.script.interval(step), f"budget from step {step}")
        t0 = time.monotonic()
        before = rt.status()  # the profile from the steps before this one
        forecast = predict(before)
        batch = rt.next_batch(timeout_s=BATCH_TIMEOUT_S)
        got = time.monotonic()
        s = rt.status()
        began = time.monotonic()
        metrics, weights, train_s, cycle = self.train_on(step, batch)
        end = time.monotonic()
        self.training.append((began, end))
        generated = sum(t.n_generated for t in batch)
        trained = int(metrics.get("tokens", sum(t.n_tokens for t in batch)))
        duration = end - since
        pipeline = rt.stats().pipeline
        report = pipeline.last_batch if pipeline is not None else None
        self.records.append(
            StepRecord(
                step=step,
                end_s=end - self.timeline.t0,
                duration_s=duration,
                wait_batch_s=got - t0,
                train_s=train_s,
                return_s=rt.last_return_s,
                generated_tokens=generated,
                trained_tokens=trained,
                throughput_tok_s=(generated + trained) / max(duration, 1e-9),
                reward=float(metrics.get("reward_mean", 0.0)),
                loss=float(metrics.get("loss", 0.0)),
                version=step,
                mode=s.mode,
                N_P=s.N_P,
                N_D=s.N_D,
                N_C=s.N_C,
                workers=counts(s).workers,
                predicted_makespan_s=predict_batch(before.profile, report) if report else forecast,
                measured_makespan_s=report.makespan_s if report else None,
                borrow=borrow_record(cycle),
                forecast_makespan_s=forecast,
                in_flight=report.in_flight if report else None,
                mean_workers=dict(report.workers) if report else {},
            )
        )
        self.evaluate(step, weights, last=last)
        return end

    def train_on(
        self, step: int, batch: Batch
    ) -> tuple[dict[str, float], dict[str, Any], float, BorrowCycleStatus | None]:
        """Training Begin, one GRPO update on ``batch``, the weights published, Training End.
        Returns the update's metrics, the weights, the seconds it trained, and the borrow cycle
        of the window before this step (None if there was none)."""
        import torch

        rt = self.rt
        with rt.training(step, weights_version=step):
            cycle = rt.status().borrow.current
            if cycle is not None and cycle.step != step - 1:
                cycle = None  # not the window before this step (a reused state dir)
            self.timeline.event(returned_line(step, cycle, rt.last_return_s))
            t_train = time.monotonic()
            metrics = self.trainer.step(batch)
            weights = self.trainer.state_dict()
            if not math.isfinite(float(metrics.get("loss", 0.0))) or not all(
                bool(torch.isfinite(t).all()) for t in weights.values()
            ):
                raise PearlError(f"training step {step} diverged (loss {metrics['loss']})")
            rt.publish_weights(weights, step)
            train_s = time.monotonic() - t_train
        return metrics, weights, train_s, cycle

    def evaluate(self, step: int, weights: dict[str, Any], *, last: int) -> None:
        """Held-out evaluation of ``weights`` when due, and the live line's state."""
        from pearl.demo import learning as learn

        if self.evals is not None and learn.eval_due(self.learning, step, last):
            self.evals.submit(step, weights, step)
        latest = self.evals.latest() if self.evals is not None else None
        self.state.update(
            step=step,
            throughput=self.records[-1].throughput_tok_s,
            reward=self.records[-1].reward,
            accuracy=latest and latest["accuracy"],
        )

    def stop(self) -> tuple[RuntimeStats, list[dict[str, Any]]]:
        """Halt the trace and the live view, stop the runtime (its counts taken first); returns
        those counts and the held-out results."""
        self.driver.halt.set()
        self.live.halt.set()
        if self.live.is_alive():
            self.live.join(2.0)
            if self.live.tty and not self.quiet:
                print(flush=True)
        try:
            stats = self.rt.stats()  # what this run's pearld counted, before it stops
        finally:
            self.rt.stop()
        if stats.pipeline is not None:
            count_cut_short(stats.pipeline.migrations, self.records, self.training)
        return stats, self.evals.results() if self.evals is not None else []


def fresh_out(out: Path) -> None:
    """Refuse an ``out`` that holds a run already: a run's log holds its workers and steps, and
    replaying it into a new run would adopt hosts that are gone and a trainer that is not (a demo
    run is not resumable)."""
    if (out / "state").exists():
        raise PearlError(
            f"{out} already holds a demo run ({out / 'state'}): choose another --out or remove it"
        )


def run(
    config: str | Path,
    steps: int,
    out: Path,
    *,
    segment: str | None = None,
    trace_s: float | None = None,
    lr: float = 3e-4,
    overrides: tuple[str, ...] = (),
    quiet: bool = False,
    seed: int | None = None,
    learning: Learning | None = None,
) -> dict[str, Any]:
    """Run the demo job; returns the report (also written to ``out/report.json``).

    ``seed`` fixes tasks, sampling and initial weights; ``learning``
    (:class:`pearl.demo.learning.Learning`) adds the cached warm start and held-out evaluation."""
    import torch

    from pearl.demo import learning as learn

    fresh_out(out)
    torch.set_num_threads(1)  # one torch thread per slot: the trainer's is this process's
    out.mkdir(parents=True, exist_ok=True)
    overrides, _ = virtual_devices(config, overrides)
    prepared = learn.prepare(
        config=config,
        overrides=learn.seeded(overrides, seed),
        out=out,
        learning=learning,
        quiet=quiet,
    )
    rt = Runtime.from_config(config, state_dir=out / "state", overrides=prepared.overrides)
    timeline = Timeline(time.monotonic())
    rt.start()
    job = Job(
        rt,
        timeline,
        prepared=prepared,
        learning=learning,
        lr=lr,
        segment=segment,
        trace_s=trace_s or rt.cfg.demo.trace_s or 4.0 * steps,
        quiet=quiet,
    )
    try:
        interrupted = job.train(steps)
    finally:
        stats, held_out = job.stop()
    return write_report(
        out=out,
        cfg=rt.cfg,
        records=job.records,
        timeline=timeline,
        interrupted=interrupted,
        deaths=stats.host_deaths,
        evals=held_out,
        learning={**prepared.warm_start, "settings": learn.describe(learning)},
        groups=pipeline_counts(stats),
        switches=mode_switches(stats, timeline.t0),
    )


__all__ = ["BudgetScript", "Job", "LiveView", "TraceDriver", "run"]
