"""The SWE-bench-like workload generator: seeded, grouped, capped."""

from __future__ import annotations

import dataclasses

from pearl.sim.workload import WorkloadParams, batch_stats, generate_batch


def test_same_seed_same_batch_other_seed_other_batch() -> None:
    p = WorkloadParams()
    assert generate_batch(p, 3, 7) == generate_batch(p, 3, 7)
    assert generate_batch(p, 3, 7) != generate_batch(p, 4, 7)
    assert generate_batch(p, 3, 7) != generate_batch(p, 3, 8)


def test_grpo_groups_share_a_task_prompt() -> None:
    p = WorkloadParams(batch=64, group_size=16)
    batch = generate_batch(p, 0, 1)
    assert len(batch) == 64
    assert [t.group for t in batch] == [g for g in range(4) for _ in range(16)]
    for g in range(4):
        prompts = {t.new[0] for t in batch if t.group == g}
        assert len(prompts) == 1


def test_trajectories_respect_the_length_limit() -> None:
    for limit in (8192, 32768):
        p = dataclasses.replace(WorkloadParams(), max_tokens=limit)
        for t in generate_batch(p, 1, 1):
            assert t.tokens <= limit
            assert len(t.new) == len(t.gen) == len(t.env) == t.turns
            assert t.env[-1] == 0.0 and min(t.gen) >= 1


def test_observation_heavy_turns() -> None:
    s = batch_stats(generate_batch(WorkloadParams(obs_tokens=1100, gen_tokens=40), 0, 1))
    assert 0.95 < s["prefill_share"] < 0.99
    assert s["turns_max"] > s["turns_mean"] > 5
