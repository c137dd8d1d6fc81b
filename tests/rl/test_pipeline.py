"""The staleness bound holds for every group handed out, in whatever order groups finish."""

from __future__ import annotations

from pearl.engines.torch import ByteTokenizer
from pearl.rl import PromptBuilder, Trajectory, Turn
from pearl.rl.pipeline import Pipeline, PipelineConfig, _Group


def group(gid: str, version: int, size: int = 2) -> _Group:
    trajs = [Trajectory(f"{gid}.{k}", gid, "task", (Turn((1,), (2,), (-1.0,), version, "stop"),),
                        1.0) for k in range(size)]
    return _Group(gid, trajs, 0.0, 1.0)


def test_a_stale_group_behind_a_fresh_one_is_dropped_not_handed_out() -> None:
    p = Pipeline(PipelineConfig(batch=4, group_size=2, staleness=1),
                 PromptBuilder(ByteTokenizer()))  # type: ignore[arg-type]
    # g2 started on v0 and finished after g1 (on v2): they land out of version order.
    p._ready.extend([group("g1", 2), group("g2", 0), group("g3", 2)])
    p.set_version(2)
    batch = p.take(timeout_s=0.01)
    assert batch is not None
    assert {t.group_id for t in batch} == {"g1", "g3"}
    assert batch.min_version >= 2 - 1
    assert p.counts["stale"] == 1
    assert p.take(timeout_s=0.01) is None  # g2 is gone, not waiting to be handed out later
