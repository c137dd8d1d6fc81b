"""Trajectory records: token / mask / logprob alignment, versions, batches, and prompt building."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.core.errors import SchemaError
from pearl.core.schema import from_plain, to_plain
from pearl.engines.base import FinishReason, GenerateResult
from pearl.rl import Batch, ChatTemplate, PromptBuilder, Trajectory, Turn
from pearl.tokenizer import ByteTokenizer


def result(
    out: list[int],
    version: int,
    reason: FinishReason = FinishReason.LENGTH,
) -> GenerateResult:
    return GenerateResult(
        rid="r",
        output_ids=tuple(out),
        logprobs=tuple(-0.5 - i for i in range(len(out))),
        finish_reason=reason,
        weights_version=version,
        prompt_tokens=0,
    )


def three_turns() -> Trajectory:
    t = Trajectory(id="t0", group_id="g0", task_id="task")
    t = t.add_turn(Turn.of([1, 2, 3], result([10, 11], 4))).add_step(0.25, 0.1)
    t = t.add_turn(Turn.of([4, 5], result([12], 5, FinishReason.ABORT)))
    t = t.add_turn(Turn.of([], result([13, 14], 6, FinishReason.STOP))).add_step(1.0, 0.2)
    return t.finish()


def test_tokens_mask_logprobs_and_versions_are_aligned() -> None:
    t = three_turns()
    assert t.tokens() == (1, 2, 3, 10, 11, 4, 5, 12, 13, 14)
    assert t.loss_mask() == (0, 0, 0, 1, 1, 0, 0, 1, 1, 1)
    assert t.rollout_logprobs() == (0, 0, 0, -0.5, -1.5, 0, 0, -0.5, -0.5, -1.5)
    assert t.token_versions() == (-1, -1, -1, 4, 4, -1, -1, 5, 6, 6)
    assert t.n_tokens == 10 and t.n_generated == 5
    assert (t.min_version, t.max_version, t.n_turns) == (4, 6, 2)  # the abort resumed, 2 turns
    assert t.reward == pytest.approx(1.25) and t.env_s == pytest.approx(0.3) and t.done
    assert [x.reward for x in t.turns] == [0.25, 0.0, 1.0]
    assert t.turns[1].finish_reason == "abort" and t.turns[2].finish_reason == "stop"


def test_records_round_trip_through_msgpack() -> None:
    b = Batch(
        step=3, trajectories=(three_turns(), Trajectory(id="t1", group_id="g0", task_id="task"))
    )
    wire = msgpack.packb(to_plain(b))
    back = from_plain(Batch, msgpack.unpackb(wire))
    assert back == b and back.trajectories[0].tokens() == b.trajectories[0].tokens()


def test_inconsistent_records_are_refused() -> None:
    with pytest.raises(SchemaError, match="logprobs"):
        Turn(
            prompt_ids=(1,),
            output_ids=(2, 3),
            logprobs=(-1.0,),
            weights_version=0,
            finish_reason="stop",
        )
    with pytest.raises(SchemaError, match="done"):
        three_turns().add_turn(
            Turn(
                prompt_ids=(),
                output_ids=(1,),
                logprobs=(0.0,),
                weights_version=0,
                finish_reason="stop",
            )
        )
    with pytest.raises(SchemaError, match="no turn"):
        Trajectory(id="t", group_id="g", task_id="x").add_step(1.0, 0.0)


def test_batches_group_by_group_id_and_know_their_staleness() -> None:
    def traj(i: int, g: str, v: int) -> Trajectory:
        return Trajectory(
            id=f"t{i}",
            group_id=g,
            task_id="x",
            turns=(
                Turn(
                    prompt_ids=(1,),
                    output_ids=(2,),
                    logprobs=(-1.0,),
                    weights_version=v,
                    finish_reason="stop",
                ),
            ),
            reward=1.0 * i,
        )

    b = Batch(
        step=7, trajectories=(traj(0, "a", 5), traj(1, "b", 6), traj(2, "a", 6), traj(3, "b", 4))
    )
    groups = b.groups()
    assert list(groups) == ["a", "b"]
    assert [t.id for t in groups["a"]] == ["t0", "t2"] and [t.id for t in groups["b"]] == [
        "t1",
        "t3",
    ]
    assert b.min_version == 4 and b.staleness(6) == 2 and len(b) == 4
    assert b.stats()["reward_mean"] == pytest.approx(1.5)


def builder(max_len: int = 200, **kw: object) -> PromptBuilder:
    return PromptBuilder(ByteTokenizer(), max_len=max_len, **kw)  # type: ignore[arg-type]


def test_incremental_prompts_equal_the_whole_history_rendered() -> None:
    b = builder(max_len=1000, template=ChatTemplate(system="be brief"))
    tok = ByteTokenizer()
    first = b.first("2+2?")
    t = Trajectory(id="t", group_id="g", task_id="x").add_turn(
        Turn.of(first, result(tok.encode("<calc>2+2</calc>"), 0))
    )
    nxt = b.next(t, "<result>4</result>")
    assert nxt is not None
    t = t.add_turn(Turn.of(nxt, result(tok.encode("<answer>4</answer>"), 0)))
    history = [
        ("system", "be brief"),
        ("user", "2+2?"),
        ("assistant", "<calc>2+2</calc>"),
        ("user", "<result>4</result>"),
        ("assistant", "<answer>4</answer>"),
    ]
    assert t.tokens() + b.frame.close == b.render(history)
    assert first[0] == tok.bos_id
    assert b.decode(t.turns[1].output_ids) == "<answer>4</answer>"


def test_a_turn_that_stopped_on_eos_is_not_closed_again() -> None:
    b, tok = builder(), ByteTokenizer()
    t = Trajectory(id="t", group_id="g", task_id="x").add_turn(
        Turn.of(b.first("hi"), result([*tok.encode("ok"), tok.eos_id], 0, FinishReason.STOP))
    )
    nxt = b.next(t, "more")
    assert nxt is not None and tok.decode(nxt).startswith("<|im_start|>user\nmore")
    assert b.stop_ids == (tok.eos_id,)


@settings(max_examples=60, deadline=None)
@given(
    obs=st.lists(st.text(max_size=300), min_size=1, max_size=6),
    gen=st.lists(st.integers(0, 60), min_size=6, max_size=6),
    max_len=st.integers(120, 600),
)
def test_a_trajectory_never_exceeds_max_len(obs: list[str], gen: list[int], max_len: int) -> None:
    b = builder(max_len=max_len, min_new_tokens=4)
    t = Trajectory(id="t", group_id="g", task_id="x")
    new: tuple[int, ...] | None = b.first(obs[0])
    for k in range(6):
        assert new is not None
        n = b.max_new_tokens(t, new, gen[k])
        assert n >= min(gen[k], 4)  # room for min_new_tokens was reserved
        t = t.add_turn(Turn.of(new, result([65] * n, 0)))
        assert t.n_tokens <= max_len
        new = b.next(t, obs[(k + 1) % len(obs)])
        if new is None:
            f = b.frame
            fewest = len(f.close) + len(f.user_pre) + 2 + len(f.elision) + len(f.user_post)
            assert max_len - t.n_tokens - 4 < fewest  # not even two observation tokens fit
            break


def test_long_observations_keep_their_head_and_tail() -> None:
    b = builder(max_len=160)
    ids = b.first("HEAD" + "x" * 500 + "TAIL")
    text = ByteTokenizer().decode(ids)
    assert len(ids) == 160 - b.min_new_tokens
    assert "HEAD" in text and "TAIL" in text and "[truncated]" in text
    with pytest.raises(ValueError, match="max_len"):
        builder(max_len=20).first("hello")
