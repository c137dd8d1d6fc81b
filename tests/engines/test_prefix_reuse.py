"""Prefix reuse across the turns of a trajectory; LRU eviction under a small KV budget."""

from __future__ import annotations

from pearl.engines.base import Engine, GenerateRequest, GenerateResult, SamplingParams

from .helpers import Engines, prompt_of


def turn(
    engine: Engine, rid: str, prompt: tuple[int, ...], trajectory: str, new: int = 6
) -> GenerateResult:
    req = GenerateRequest(
        rid=rid,
        input_ids=prompt,
        sampling=SamplingParams(max_new_tokens=new),
        trajectory=trajectory,
    )
    return engine.generate(req).result(60)


def next_prompt(prompt: tuple[int, ...], r: GenerateResult, obs: int, salt: int) -> tuple[int, ...]:
    """The next turn's context: previous context, the model's answer, a new observation."""
    return prompt + r.output_ids + prompt_of(obs, salt + 100)


def test_second_turn_prefills_only_new_tokens(engines: Engines) -> None:
    e = engines.make()
    p1 = prompt_of(70)
    r1 = turn(engine=e, rid="t1", prompt=p1, trajectory="traj")
    assert r1.cached_tokens == 0
    e.telemetry()
    p2 = next_prompt(prompt=p1, r=r1, obs=25, salt=0)
    r2 = turn(engine=e, rid="t2", prompt=p2, trajectory="traj")
    # everything but the last generated token had its K/V computed in turn 1
    assert r2.cached_tokens == len(p1) + len(r1.output_ids) - 1
    prefilled = sum(it.prefill_tokens for it in e.telemetry().iterations)
    assert prefilled == len(p2) - r2.cached_tokens == 26
    fresh = engines.make()
    assert (
        turn(engine=fresh, rid="ref", prompt=p2, trajectory="").output_ids == r2.output_ids
    )  # reused K/V is the right K/V


def test_diverging_context_reuses_only_the_common_prefix(engines: Engines) -> None:
    e = engines.make()
    p1 = prompt_of(50)
    turn(engine=e, rid="t1", prompt=p1, trajectory="traj")
    p2 = p1[:30] + prompt_of(10, 9)
    r2 = turn(engine=e, rid="t2", prompt=p2, trajectory="traj")
    assert r2.cached_tokens == 30
    assert (
        r2.output_ids == turn(engine=engines.make(), rid="ref", prompt=p2, trajectory="").output_ids
    )


def test_other_trajectories_and_weight_updates_do_not_reuse(engines: Engines) -> None:
    from .helpers import new_weights

    e = engines.make()
    p1 = prompt_of(40)
    r1 = turn(engine=e, rid="t1", prompt=p1, trajectory="a")
    assert (
        turn(
            engine=e, rid="t2", prompt=next_prompt(prompt=p1, r=r1, obs=5, salt=0), trajectory="b"
        ).cached_tokens
        == 0
    )
    e.load_weights(1, new_weights(engines.kind, seed=5))
    assert (
        turn(
            engine=e, rid="t3", prompt=next_prompt(prompt=p1, r=r1, obs=5, salt=0), trajectory="a"
        ).cached_tokens
        == 0
    )


def test_lru_eviction_under_a_small_budget_stays_correct(engines: Engines) -> None:
    big = engines.make()
    per_token = big.kv_usage()["bytes_per_page"] // 16  # type: ignore[attr-defined]
    # room for about three trajectories' prefixes (64 + 6 tokens each) and one running sequence
    small = engines.make(kv_budget_bytes=per_token * 16 * 22, page_size=16)
    prompts = [prompt_of(64, i) for i in range(6)]
    first = [
        turn(engine=small, rid=f"a{i}", prompt=p, trajectory=f"traj{i}")
        for i, p in enumerate(prompts)
    ]
    usage = small.kv_usage()  # type: ignore[attr-defined]
    assert usage["evictions"] > 0 and usage["cached"] <= usage["pages"]
    second = []
    for i in reversed(range(6)):  # most recent first: these are still resident
        p2 = next_prompt(prompt=prompts[i], r=first[i], obs=8, salt=i)
        second.append((i, p2, turn(engine=small, rid=f"b{i}", prompt=p2, trajectory=f"traj{i}")))
    cached = {i: r.cached_tokens for i, _, r in second}
    assert cached[5] > 0 and cached[0] == 0  # LRU: the oldest trajectory was evicted
    for i, p2, r in second:
        assert r.output_ids == turn(engine=big, rid=f"ref{i}", prompt=p2, trajectory="").output_ids
