"""The GRPO trainer: version 0 equals the engine's, a step changes the weights the right way."""

from __future__ import annotations

import pytest
import torch

from pearl.engines.base import GenerateRequest, SamplingParams
from pearl.engines.torch import TorchEngine
from pearl.rl import Batch, GRPOTrainer, TrainerError, Trajectory, Turn, group_advantages

PROMPT_TEXT = "Compute (3 + 4) * 2."


def sampled(engine: TorchEngine, n: int = 8, group: int = 4) -> list[Trajectory]:
    """n trajectories sampled by the engine; odd ones rewarded 1, even ones 0."""
    prompt = tuple(engine.tokenizer.encode(PROMPT_TEXT, add_bos=True))
    out = []
    for i in range(n):
        sp = SamplingParams(max_new_tokens=20, temperature=1.0, seed=i)
        r = engine.generate(GenerateRequest(rid=f"s{i}", input_ids=prompt, sampling=sp)).result(60)
        out.append(
            Trajectory(
                id=f"t{i}",
                group_id=f"g{i // group}",
                task_id="task",
                turns=(Turn.of(prompt, r),),
                reward=float(i % 2),
                done=True,
            )
        )
    return out


def test_trainer_version_0_is_the_engines_version_0(engine: TorchEngine) -> None:
    trainer = GRPOTrainer(device="cpu")
    prompt = tuple(engine.tokenizer.encode(PROMPT_TEXT, add_bos=True))
    r = engine.generate(
        GenerateRequest(rid="g", input_ids=prompt, sampling=SamplingParams(max_new_tokens=16))
    ).result(60)
    assert r.weights_version == 0 == trainer.version
    traj = Trajectory(id="t", group_id="g", task_id="x", turns=(Turn.of(prompt, r),))
    assert trainer.logprobs([traj])[0] == pytest.approx(list(r.logprobs), abs=1e-4)
    with torch.no_grad():  # greedy under the trainer's model: the same tokens
        logits = trainer.model(torch.tensor([traj.tokens()])).logits[0]
    greedy = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
    assert greedy == list(r.output_ids)
    other = GRPOTrainer(device="cpu", seed=1)  # a different seed is a different model
    assert other.logprobs([traj])[0] != pytest.approx(list(r.logprobs), abs=1e-2)


def test_a_step_changes_the_weights_and_favours_rewarded_sequences(engine: TorchEngine) -> None:
    trajs = sampled(engine)
    trainer = GRPOTrainer(device="cpu", lr=3e-4)
    before_w = {k: v.clone() for k, v in trainer.state_dict().items()}
    before = trainer.logprobs(trajs)
    m = trainer.step(Batch(step=0, trajectories=tuple(trajs)))
    after = trainer.logprobs(trajs)
    changed = [k for k, v in trainer.state_dict().items() if not torch.equal(v, before_w[k])]
    assert len(changed) == len(before_w)
    for t, b, a in zip(trajs, before, after, strict=True):
        delta = sum(a) - sum(b)
        assert (delta > 0.1) if t.reward > 0 else (delta < -0.1), (t.id, delta)
    assert trainer.version == 1 and m["version"] == 1
    assert m["tokens"] == sum(t.n_generated for t in trajs) and m["trajectories"] == 8
    assert m["reward_mean"] == pytest.approx(0.5) and m["clip_frac"] == 0.0  # on-policy
    assert m["ratio"] == pytest.approx(1.0, abs=1e-4) and m["grad_norm"] > 0
    assert m["staleness"] == 0 and m["seconds"] > 0


def test_steps_are_deterministic(engine: TorchEngine) -> None:
    batch = Batch(step=0, trajectories=tuple(sampled(engine)))
    a, b = GRPOTrainer(device="cpu", lr=1e-3), GRPOTrainer(device="cpu", lr=1e-3)
    ma, mb = a.step(batch), b.step(batch)
    assert {k: v for k, v in ma.items() if k != "seconds"} == {
        k: v for k, v in mb.items() if k != "seconds"
    }
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_off_policy_tokens_are_clipped(engine: TorchEngine) -> None:
    trajs = sampled(engine)
    stale = [
        Trajectory(
            id=t.id,
            group_id=t.group_id,
            task_id=t.task_id,
            turns=tuple(
                Turn(
                    prompt_ids=u.prompt_ids,
                    output_ids=u.output_ids,
                    logprobs=tuple(x - 1.0 for x in u.logprobs),
                    weights_version=0,
                    finish_reason="length",
                )
                for u in t.turns
            ),
            reward=t.reward,
            done=True,
        )
        for t in trajs
    ]  # the rollout policy was e-times less
    m = GRPOTrainer(device="cpu").step(Batch(step=0, trajectories=tuple(stale)))
    assert m["ratio"] == pytest.approx(2.718, rel=0.01) and m["clip_frac"] > 0.3


def test_tokens_outside_the_trust_region_give_no_gradient(engine: TorchEngine) -> None:
    """Rewarded tokens whose ratio is above 1 + eps and penalised ones below 1 - eps are clipped:
    with every token so, the step has nothing to follow."""
    trajs = sampled(engine, n=2, group=2)  # t0 reward 0 (A < 0), t1 reward 1 (A > 0)
    shift = {0: +1.0, 1: -1.0}  # ratio = exp(logp - old): 1/e for t0, e for t1
    moved = tuple(
        Trajectory(
            id=t.id,
            group_id=t.group_id,
            task_id=t.task_id,
            turns=tuple(
                Turn(
                    prompt_ids=u.prompt_ids,
                    output_ids=u.output_ids,
                    logprobs=tuple(x + shift[i] for x in u.logprobs),
                    weights_version=0,
                    finish_reason="length",
                )
                for u in t.turns
            ),
            reward=t.reward,
            done=True,
        )
        for i, t in enumerate(trajs)
    )
    trainer = GRPOTrainer(device="cpu", lr=1e-3)
    before = {k: v.clone() for k, v in trainer.state_dict().items()}
    m = trainer.step(Batch(step=0, trajectories=moved))
    assert m["clip_frac"] == 1.0 and m["grad_norm"] == 0.0
    assert all(torch.equal(v, before[k]) for k, v in trainer.state_dict().items())
    wide = GRPOTrainer(device="cpu", lr=1e-3, clip_eps=0.9, clip_eps_high=5.0).step(
        Batch(step=0, trajectories=moved)
    )  # the same tokens inside a wider region do move the policy
    assert wide["clip_frac"] == 0.0 and wide["grad_norm"] > 0


def test_group_advantages() -> None:
    def t(i: int, g: str, r: float) -> Trajectory:
        return Trajectory(
            id=f"t{i}",
            group_id=g,
            task_id="x",
            turns=(
                Turn(
                    prompt_ids=(1,),
                    output_ids=(2,),
                    logprobs=(-1.0,),
                    weights_version=0,
                    finish_reason="stop",
                ),
            ),
            reward=r,
        )

    adv = group_advantages(
        Batch(
            step=0,
            trajectories=(
                t(0, "a", 1.0),
                t(1, "a", 0.0),
                t(2, "b", 0.3),
                t(3, "b", 0.3),
                t(4, "a", 0.5),
            ),
        )
    )
    assert adv["t0"] == pytest.approx(1.2247, abs=1e-3)
    assert adv["t1"] == pytest.approx(-1.2247, abs=1e-3) and adv["t4"] == pytest.approx(0.0)
    assert adv["t2"] == adv["t3"] == 0.0  # equal rewards: nothing to learn from that group


def test_kl_and_entropy_terms(engine: TorchEngine) -> None:
    batch = Batch(step=0, trajectories=tuple(sampled(engine, n=4)))
    trainer = GRPOTrainer(device="cpu", lr=1e-3, kl_coef=0.1, entropy_coef=0.01)
    first = trainer.step(batch)
    second = trainer.step(batch)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6) and second["kl"] > 0  # moved away from v0
    assert first["entropy"] > 1.0  # a random model is far from deterministic
    with pytest.raises(TrainerError, match="unknown GRPO option"):
        GRPOTrainer(learning_rate=1.0)
    with pytest.raises(TrainerError, match="no generated token"):
        trainer.step(Batch(step=1, trajectories=(Trajectory(id="e", group_id="g", task_id="x"),)))
