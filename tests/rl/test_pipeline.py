"""The staleness bound holds for every group handed out, in whatever order groups finish."""

from __future__ import annotations

from pearl.rl import PromptBuilder, Trajectory, Turn
from pearl.rl.pipeline import Pipeline, PipelineConfig, _Group
from pearl.tokenizer import ByteTokenizer


def group(gid: str, version: int, size: int = 2) -> _Group:
    trajs = [
        Trajectory(f"{gid}.{k}", gid, "task", (Turn((1,), (2,), (-1.0,), version, "stop"),), 1.0)
        for k in range(size)
    ]
    return _Group(gid, trajs, 0.0, 1.0)


def test_a_stale_group_behind_a_fresh_one_is_dropped_not_handed_out() -> None:
    p = Pipeline(PipelineConfig(batch=4, group_size=2, staleness=1), PromptBuilder(ByteTokenizer()))  # type: ignore[arg-type]
    # g2 started on v0 and finished after g1 (on v2): they land out of version order.
    p._ready.extend([group("g1", 2), group("g2", 0), group("g3", 2)])
    p.set_version(2)
    batch = p.take(timeout_s=0.01)
    assert batch is not None
    assert {t.group_id for t in batch} == {"g1", "g3"}
    assert batch.min_version >= 2 - 1
    assert p.counts["stale"] == 1
    assert p.take(timeout_s=0.01) is None  # g2 is gone, not waiting to be handed out later


def test_a_batch_reports_its_concurrency_workers_and_prefilled_tokens() -> None:
    import asyncio

    from pearl.engines.base import FinishReason, GenerateResult, SamplingParams

    p = Pipeline(PipelineConfig(batch=4, group_size=2, staleness=1), PromptBuilder(ByteTokenizer()))  # type: ignore[arg-type]

    async def generate(ids: tuple[int, ...], sp: SamplingParams, tid: str) -> GenerateResult:
        # The worker reused 60 of the 100 prompt tokens from the trajectory's resident prefix,
        # and decoded in 3 iterations that held 12 sequences between them.
        return GenerateResult(f"r-{tid}", (2,), (-1.0,), FinishReason.STOP, 0, 100, 60, 3, 12)

    p.attach(generate)
    for tid in ("g1.0", "g1.0", "g1.1", "g2.0", "g2.1"):
        asyncio.run(p._counted((1,) * 100, SamplingParams(), tid))
    p._ready.extend([group("g1", 0), group("g2", 0)])  # both ran from t = 0 to t = 1
    # Samples inside the span count; the one after it (another batch's) does not.
    p._flight.extend(
        [
            (0.2, 6, (3, 0, 0), (0, 0, 0)),
            (0.8, 10, (2, 0, 0), (0, 0, 0)),
            (5.0, 99, (1, 0, 0), (0, 0, 0)),
        ]
    )
    assert p.take(timeout_s=0.01) is not None
    report = p.reports[-1]
    assert report.in_flight == 8.0
    assert report.workers == {"colocated": 2.5, "prefill": 0.0, "decode": 0.0}
    assert [t.prefilled_tokens for t in report.trajectories] == [80, 40, 40, 40]
    assert [t.seen_batch for t in report.trajectories] == [4.0, 4.0, 4.0, 4.0]


def test_lent_workers_count_for_a_batch_only_once_it_is_the_one_waited_for() -> None:
    """The Router gives lent workers the critical path alone: a batch started while the one
    before was still running had them only after that one was handed out."""
    now = [0.0]
    p = Pipeline(
        PipelineConfig(batch=2, group_size=2, staleness=1),
        PromptBuilder(ByteTokenizer()),
        clock=lambda: now[0],
    )
    # 3 colocated workers throughout, of which 2 lent (before and after batch 1's hand-out).
    p._flight.extend([(0.2, 4, (3, 0, 0), (2, 0, 0)), (0.8, 4, (3, 0, 0), (2, 0, 0))])
    p._ready.append(group("g1", 0))  # batch 1 ran from t = 0 to t = 1: waited for throughout
    now[0] = 0.5
    assert p.take(timeout_s=0.01) is not None
    assert p.reports[-1].workers["colocated"] == 3.0
    p._ready.append(group("g2", 0))  # batch 2 ran from t = 0 too: lent workers from t = 0.5
    assert p.take(timeout_s=0.01) is not None
    assert p.reports[-1].workers == {"colocated": 2.0, "prefill": 0.0, "decode": 0.0}  # (1 + 3) / 2


def test_a_batch_reports_how_far_apart_its_groups_started() -> None:
    p = Pipeline(PipelineConfig(batch=4, group_size=2, staleness=1), PromptBuilder(ByteTokenizer()))  # type: ignore[arg-type]
    late = group("g2", 0)
    late.started, late.finished = 0.4, 1.5  # started when capacity freed, 0.4 s after g1
    p._ready.extend([group("g1", 0), late])
    assert p.take(timeout_s=0.01) is not None
    report = p.reports[-1]
    assert report.makespan_s == 1.5 and report.start_spread_s == 0.4


def test_no_group_starts_that_would_be_too_stale_when_its_batch_is_taken() -> None:
    # Batches of 2 groups, staleness 1: two batches ahead while rollout runs alone, one while the
    # trainer trains on a batch (a group started then is taken two versions later and dropped).
    p = Pipeline(PipelineConfig(batch=4, group_size=2, staleness=1), PromptBuilder(ByteTokenizer()))  # type: ignore[arg-type]
    assert p.admission_target() == 4
    p._ready.extend([group("g1", 0), group("g2", 0)])
    assert p.take(timeout_s=0.01) is not None  # training step 1 begins
    assert p.admission_target() == 2
    p.set_version(0)  # not a new version: still training
    assert p.admission_target() == 2
    p.set_version(1)  # step 1's weights are published
    assert p.admission_target() == 4
    # On-policy (staleness 0) keeps one batch in flight: never none, or nothing would be taken.
    q = Pipeline(PipelineConfig(batch=4, group_size=2, staleness=0), PromptBuilder(ByteTokenizer()))  # type: ignore[arg-type]
    q._ready.extend([group("g1", 0), group("g2", 0)])
    assert q.take(timeout_s=0.01) is not None
    assert q.admission_target() == 2


def test_the_next_batch_eta_follows_the_running_groups_and_the_latencies_seen() -> None:
    """The borrowing gate's view of how long a training-idle window has left (issue 13: a
    borrow approved in a window that closed 13-35 ms later was cut short before it lent)."""
    now = [10.0]
    p = Pipeline(
        PipelineConfig(batch=4, group_size=2, staleness=1),
        PromptBuilder(ByteTokenizer()),  # type: ignore[arg-type]
        clock=lambda: now[0],
    )
    p._running_groups.update({"g1": 9.0, "g2": 8.0})
    assert p.next_batch_eta_s() is None  # no group has finished: no latency to go by
    p._group_s.extend([2.0, 3.0, 4.0])
    # g1 ran 1 s: every latency seen is longer, median 3 s, so 2 s left; g2 ran 2 s: of 3 and 4,
    # median 3.5, so 1.5 s left. Both are needed: the batch is due when the later one is.
    assert p.next_batch_eta_s() == 2.0
    p._ready.append(group("g0", 0))  # one group ready: the first to finish completes the batch
    assert p.next_batch_eta_s() == 1.5
    now[0] = 12.5  # g1 ran 3.5 s: only the 4 s group took longer, so 0.5 s left
    assert p.next_batch_eta_s() == 0.5  # g2 (4.5 s, longer than any seen) is not needed
    p._ready.clear()
    assert p.next_batch_eta_s() is None  # both are: g2's end cannot be foreseen
    p._ready.extend([group("g0", 0), group("g3", 0)])
    assert p.next_batch_eta_s() == 0.0  # complete
    p._ready.clear()
    now[0] = 10.0
    p._running_groups.pop("g2")
    assert p.next_batch_eta_s() is None  # a group the batch needs has not started


def test_the_critical_path_is_the_oldest_running_groups_the_next_batch_still_needs() -> None:
    p = Pipeline(PipelineConfig(batch=4, group_size=2, staleness=1), PromptBuilder(ByteTokenizer()))  # type: ignore[arg-type]
    p._running_groups.update({"g1": 1.0, "g2": 2.0, "g3": 3.0, "g4": 4.0})  # in start order
    # The batch needs 2 groups: g1 and g2 are its; g3 and g4 (the batch after) are not.
    assert [p.is_critical(f"{g}.1") for g in ("g1", "g2", "g3", "g4")] == [1, 1, 0, 0]
    p._ready.append(group("g3", 0))  # g3 finished first: the batch needs one group more
    del p._running_groups["g3"]
    assert [p.is_critical(f"{g}.0") for g in ("g1", "g2", "g4")] == [1, 0, 0]
    p._ready.append(group("g2", 0))  # complete: nothing is waited for
    assert not p.is_critical("g1.0")
    assert not p.is_critical("g9.0")  # not running


def test_a_running_pipeline_times_each_trajectory_and_reports_the_batch_it_decoded_in() -> None:
    """What the Runtime Tracker's kappa is made of: each trajectory's start-to-end seconds and
    the mean batch of its decode iterations, as the engines said."""
    import asyncio
    import threading

    from pearl.engines.base import FinishReason, GenerateResult, SamplingParams

    p = Pipeline(PipelineConfig(batch=4, group_size=2, staleness=1), PromptBuilder(ByteTokenizer()))  # type: ignore[arg-type]

    async def generate(ids: tuple[int, ...], sp: SamplingParams, tid: str) -> GenerateResult:
        await asyncio.sleep(0.01)
        out = tuple(ByteTokenizer().encode("The answer is 7."))
        lp = tuple(-1.0 for _ in out)
        return GenerateResult(f"r-{tid}", out, lp, FinishReason.STOP, 0, len(ids), 0, 5, 15)

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
