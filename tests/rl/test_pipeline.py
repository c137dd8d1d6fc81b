"""The staleness bound holds for every group handed out, in whatever order groups finish; a
batch reports what it ran with; the next batch's ETA and the critical path follow the groups.

Groups are driven through the Pipeline's own lifecycle calls (``group_started``,
``group_finished``, ``sample``) on a clock the test moves; the arithmetic over its records is
checked on the pure functions of :mod:`pearl.rl.progress`."""

from __future__ import annotations

import asyncio

import pytest

from pearl.engines.base import FinishReason, GenerateResult, SamplingParams
from pearl.rl import PromptBuilder, Trajectory, Turn
from pearl.rl.pipeline import Pipeline, PipelineConfig
from pearl.rl.progress import Sample, batch_occupancy, next_batch_eta
from pearl.tokenizer import ByteTokenizer


class Clock:
    """The pipeline's clock, moved by the test."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def trajectories(gid: str, version: int, size: int = 2) -> list[Trajectory]:
    return [
        Trajectory(
            id=f"{gid}.{k}",
            group_id=gid,
            task_id="task",
            turns=(
                Turn(
                    prompt_ids=(1,),
                    output_ids=(2,),
                    logprobs=(-1.0,),
                    weights_version=version,
                    finish_reason="stop",
                ),
            ),
            reward=1.0,
        )
        for k in range(size)
    ]


def pipeline(batch: int = 4, staleness: int = 1, clock: Clock | None = None) -> Pipeline:
    cfg = PipelineConfig(batch=batch, group_size=2, staleness=staleness)
    builder = PromptBuilder(ByteTokenizer())  # type: ignore[arg-type]
    return Pipeline(cfg, builder) if clock is None else Pipeline(cfg, builder, clock=clock)


def finish(p: Pipeline, *groups: tuple[str, int]) -> None:
    """Groups (id, weights version) that start and finish at once, in this order."""
    for gid, version in groups:
        p.group_started(gid)
        p.group_finished(gid, trajectories(gid, version))


def test_a_stale_group_behind_a_fresh_one_is_dropped_not_handed_out() -> None:
    p = pipeline()
    # g2 started on v0 and finished after g1 (on v2): they land out of version order.
    finish(p, ("g1", 2), ("g2", 0), ("g3", 2))
    p.set_version(2)
    batch = p.take(timeout_s=0.01)
    assert batch is not None
    assert {t.group_id for t in batch} == {"g1", "g3"}
    assert batch.min_version >= 2 - 1
    assert p.counts["stale"] == 1
    assert p.take(timeout_s=0.01) is None  # g2 is gone, not waiting to be handed out later
    assert p.counts == {"started": 3, "delivered": 2, "stale": 1, "failed": 0}


def test_a_group_with_a_failed_member_is_dropped_and_counted() -> None:
    p = pipeline()
    p.group_started("g1")
    assert p.is_critical("g1.0")
    p.group_finished("g1", trajectories("g1", 0)[:1], [RuntimeError("boom")])
    assert not p.is_critical("g1.0")  # not running any more
    assert p.counts["failed"] == 1 and p.failed == 1
    assert p.ready_trajectories == 0


def test_a_batch_reports_its_concurrency_workers_and_prefilled_tokens() -> None:
    now = Clock()
    p = pipeline(clock=now)

    async def generate(ids: tuple[int, ...], sp: SamplingParams, tid: str) -> GenerateResult:
        # The worker reused 60 of the 100 prompt tokens from the trajectory's resident prefix,
        # and decoded in 3 iterations that held 12 sequences between them.
        return GenerateResult(
            rid=f"r-{tid}",
            output_ids=(2,),
            logprobs=(-1.0,),
            finish_reason=FinishReason.STOP,
            weights_version=0,
            prompt_tokens=100,
            cached_tokens=60,
            decode_steps=3,
            decode_batch_sum=12,
        )

    p.attach(generate)
    assert p.generate_fn is generate
    for tid in ("g1.0", "g1.0", "g1.1", "g2.0", "g2.1"):
        asyncio.run(p.generate((1,) * 100, SamplingParams(), tid))
    p.group_started("g1")
    p.group_started("g2")  # both run from t = 0 to t = 1
    # Samples inside the span count; the one after it (another batch's) does not.
    for t, colocated in ((0.2, 3), (0.8, 2)):
        now.t = t
        p.set_workers(colocated, 0, 0)
        p.sample()
    now.t = 1.0
    p.group_finished("g1", trajectories("g1", 0))
    p.group_finished("g2", trajectories("g2", 0))
    now.t = 5.0
    p.set_workers(1, 0, 0)
    p.sample()
    assert p.take(timeout_s=0.01) is not None
    report = p.reports[-1]
    assert report.makespan_s == 1.0
    assert report.in_flight == 0.0  # no trajectory ran in this pipeline
    assert report.workers == {"colocated": 2.5, "prefill": 0.0, "decode": 0.0}
    assert [t.prefilled_tokens for t in report.trajectories] == [80, 40, 40, 40]
    assert [t.seen_batch for t in report.trajectories] == [4.0, 4.0, 4.0, 4.0]


def test_a_batch_occupancy_is_the_mean_over_the_samples_in_its_span() -> None:
    samples = [
        Sample(at=0.2, in_flight=6, workers=(3, 0, 0), lent=(0, 0, 0)),
        Sample(at=0.8, in_flight=10, workers=(2, 0, 0), lent=(0, 0, 0)),
        Sample(at=5.0, in_flight=99, workers=(1, 0, 0), lent=(0, 0, 0)),  # another batch's
    ]
    now = Sample(at=1.0, in_flight=7, workers=(4, 1, 1), lent=(0, 0, 0))
    in_flight, workers = batch_occupancy(
        samples=samples, t0=0.0, t1=1.0, critical_from=-float("inf"), last=now
    )
    assert in_flight == 8.0
    assert workers == {"colocated": 2.5, "prefill": 0.0, "decode": 0.0}
    # A span shorter than one sample period: the pipeline as it is now.
    in_flight, workers = batch_occupancy(
        samples=samples, t0=0.3, t1=0.7, critical_from=-float("inf"), last=now
    )
    assert in_flight == 7.0 and workers == {"colocated": 4.0, "prefill": 1.0, "decode": 1.0}
    # Lent workers count only from when the batch became the one waited for.
    lent = [
        Sample(at=0.2, in_flight=4, workers=(3, 0, 0), lent=(2, 0, 0)),
        Sample(at=0.8, in_flight=4, workers=(3, 0, 0), lent=(2, 0, 0)),
    ]
    assert (
        batch_occupancy(samples=lent, t0=0.0, t1=1.0, critical_from=0.5, last=now)[1]["colocated"]
        == 2.0
    )  # (1 + 3) / 2


def test_lent_workers_count_for_a_batch_only_once_it_is_the_one_waited_for() -> None:
    """The Router gives lent workers the critical path alone: a batch started while the one
    before was still running had them only after that one was handed out."""
    now = Clock()
    p = pipeline(batch=2, clock=now)  # one group a batch
    p.set_workers(3, 0, 0, lent=(2, 0, 0))  # 3 colocated workers throughout, of which 2 lent
    p.group_started("g1")
    p.group_started("g2")  # both from t = 0
    now.t = 0.2
    p.sample()
    now.t = 0.5
    p.group_finished("g1", trajectories("g1", 0))
    assert p.take(timeout_s=0.01) is not None  # batch 1 was waited for throughout
    assert p.reports[-1].workers["colocated"] == 3.0
    now.t = 0.8
    p.sample()
    now.t = 1.0
    p.group_finished("g2", trajectories("g2", 0))
    assert p.take(timeout_s=0.01) is not None  # batch 2: lent workers from t = 0.5
    assert p.reports[-1].workers == {"colocated": 2.0, "prefill": 0.0, "decode": 0.0}  # (1 + 3) / 2


def test_a_batch_reports_how_far_apart_its_groups_started() -> None:
    now = Clock()
    p = pipeline(clock=now)
    p.group_started("g1")
    now.t = 0.4
    p.group_started("g2")  # started when capacity freed, 0.4 s after g1
    now.t = 1.0
    p.group_finished("g1", trajectories("g1", 0))
    now.t = 1.5
    p.group_finished("g2", trajectories("g2", 0))
    assert p.take(timeout_s=0.01) is not None
    report = p.reports[-1]
    assert report.makespan_s == 1.5 and report.start_spread_s == 0.4


def test_no_group_starts_that_would_be_too_stale_when_its_batch_is_taken() -> None:
    # Batches of 2 groups, staleness 1: two batches ahead while rollout runs alone, one while the
    # trainer trains on a batch (a group started then is taken two versions later and dropped).
    p = pipeline()
    assert p.admission_target() == 4
    finish(p, ("g1", 0), ("g2", 0))
    assert p.take(timeout_s=0.01) is not None  # training step 1 begins
    assert p.admission_target() == 2
    p.set_version(0)  # not a new version: still training
    assert p.admission_target() == 2
    p.set_version(1)  # step 1's weights are published
    assert p.admission_target() == 4
    # On-policy (staleness 0) keeps one batch in flight: never none, or nothing would be taken.
    q = pipeline(staleness=0)
    finish(q, ("g1", 0), ("g2", 0))
    assert q.take(timeout_s=0.01) is not None
    assert q.admission_target() == 2


def test_the_next_batch_eta_follows_the_running_groups_and_the_latencies_seen() -> None:
    """The borrowing gate's view of how long a training-idle window has left (issue 13: a
    borrow approved in a window that closed 13-35 ms later was cut short before it lent)."""
    # Two groups running, for 1 s and 2 s; a batch needs two groups.
    assert next_batch_eta(2, [1.0, 2.0], []) is None  # no group has finished: nothing to go by
    seen = [4.0, 2.0, 3.0]  # (in any order)
    # The 1 s one: every latency seen is longer, median 3 s, so 2 s left; the 2 s one: of 3 and
    # 4, median 3.5, so 1.5 s left. Both are needed: the batch is due when the later one is.
    assert next_batch_eta(2, [1.0, 2.0], seen) == 2.0
    assert next_batch_eta(1, [1.0, 2.0], seen) == 1.5  # one ready: the first to finish will do
    # 2.5 s later, the 3.5 s one has only the 4 s group longer: 0.5 s left ...
    assert next_batch_eta(1, [3.5, 4.5], seen) == 0.5  # the 4.5 s one (no bound) is not needed
    assert next_batch_eta(2, [3.5, 4.5], seen) is None  # ... both are: its end cannot be foreseen
    assert next_batch_eta(0, [3.5, 4.5], seen) == 0.0  # complete
    assert next_batch_eta(2, [1.0], seen) is None  # a group the batch needs has not started


def test_the_pipelines_eta_counts_its_ready_running_and_finished_groups() -> None:
    now = Clock()
    p = pipeline(clock=now)  # two groups a batch
    p.group_started("a")
    assert p.next_batch_eta_s() is None  # no latency seen yet
    now.t = 3.0
    p.group_started("b")
    now.t = 4.0
    p.group_finished("a", trajectories("a", 0))  # took 4 s; one group more is needed
    assert p.next_batch_eta_s() == 3.0  # b ran 1 s of the 4 s seen
    now.t = 5.0
    p.group_started("c")
    assert p.next_batch_eta_s() == 2.0  # b's 2 s left, before c's 4 s
    now.t = 6.0
    p.group_finished("b", trajectories("b", 0))
    assert p.next_batch_eta_s() == 0.0  # complete
    assert p.take(timeout_s=0.01) is not None
    assert p.next_batch_eta_s() is None  # the next batch needs a group not started yet


def test_the_critical_path_is_the_oldest_running_groups_the_next_batch_still_needs() -> None:
    p = pipeline()
    for g in ("g1", "g2", "g3", "g4"):
        p.group_started(g)  # in start order
    # The batch needs 2 groups: g1 and g2 are its; g3 and g4 (the batch after) are not.
    assert [p.is_critical(f"{g}.1") for g in ("g1", "g2", "g3", "g4")] == [1, 1, 0, 0]
    p.group_finished("g3", trajectories("g3", 0))  # g3 finished first: one group more is needed
    assert [p.is_critical(f"{g}.0") for g in ("g1", "g2", "g4")] == [1, 0, 0]
    p.group_finished("g2", trajectories("g2", 0))  # complete: nothing is waited for
    assert not p.is_critical("g1.0")
    assert not p.is_critical("g9.0")  # not running
    with pytest.raises(KeyError):
        p.group_finished("g9", trajectories("g9", 0))  # never started


def test_a_running_pipeline_times_each_trajectory_and_reports_the_batch_it_decoded_in() -> None:
    """What the Runtime Tracker's kappa is made of: each trajectory's start-to-end seconds and
    the mean batch of its decode iterations, as the engines said."""
    import threading

    p = pipeline()

    async def generate(ids: tuple[int, ...], sp: SamplingParams, tid: str) -> GenerateResult:
        await asyncio.sleep(0.01)
        out = tuple(ByteTokenizer().encode("The answer is 7."))
        lp = tuple(-1.0 for _ in out)
        return GenerateResult(
            rid=f"r-{tid}",
            output_ids=out,
            logprobs=lp,
            finish_reason=FinishReason.STOP,
            weights_version=0,
            prompt_tokens=len(ids),
            cached_tokens=0,
            decode_steps=5,
            decode_batch_sum=15,
        )

    p.attach(generate)
    stop = threading.Event()

    def run() -> None:
        async def main() -> None:
            halt = asyncio.Event()
            task = asyncio.create_task(p.run(halt))
            while not stop.is_set():
                await asyncio.sleep(0.01)
            halt.set()
            await task

        asyncio.run(main())

    t = threading.Thread(target=run)
    t.start()
    try:
        assert p.take(timeout_s=30) is not None
    finally:
        stop.set()
        t.join(10)
    trs = p.reports[-1].trajectories
    assert all(tr.latency_s is not None and tr.latency_s >= 0.01 for tr in trs)
    assert all(tr.seen_batch == 3.0 for tr in trs)
