"""The demo trainer: a real GRPO step in torch on the model the torch engine serves.

The model is built exactly as the engine builds it (same preset config, same seeded random
weights, or the same local directory), so version 0 of the trainer and of every engine agree.

One step (:meth:`GRPOTrainer.step`):

- advantages per group: ``A_i = (R_i - mean_g R) / (std_g R + eps)`` (population std; a group
  whose rewards are all equal gives 0);
- per generated token, with the rollout logprob from the engine that generated it:
  ``ratio = exp(logp_new - logp_rollout)`` and the clipped surrogate
  ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A)``;
- optional k3 KL to the version-0 weights and an entropy bonus (both off by default);
- averaged over the generated tokens of the whole batch (the loss mask), gradients accumulated
  over micro-batches, clipped to ``max_grad_norm``, one AdamW update; the version goes up by one.

``device_share`` makes the trainer a virtual device (:mod:`pearl.engines.device`): the step runs,
then idles in proportion to its thread CPU time. On the demo it is the share of all training slots
(one thread, so at most one core).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from pearl.core.errors import PearlError
from pearl.engines.device import VirtualDevice
from pearl.engines.torch import model as M
from pearl.rl.trajectory import Batch, Trajectory
from pearl.rl.weights import WeightStore, cpu_state


class TrainerError(PearlError):
    """The trainer cannot be built or cannot train on what it was given."""


@dataclass(frozen=True)
class GRPOConfig:
    preset: str = "tiny"  # a torch engine preset; ignored when model_path is set
    model_path: str = ""  # a local Hugging Face Qwen3 directory
    seed: int = 0  # the engine's seed: the same random weights at version 0
    device: str = "auto"  # "cpu", "cuda", "auto" (CUDA when available)
    dtype: str = "float32"  # training precision (fp32 on CPU)
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # upper clip (asymmetric, DAPO-style); None: clip_eps
    max_grad_norm: float = 1.0
    adv_eps: float = 1e-6
    kl_coef: float = 0.0  # k3 KL to the version-0 weights
    entropy_coef: float = 0.0
    micro_batch: int = 4  # trajectories per forward/backward pass
    start_version: int = 0
    device_share: float | None = None  # a virtual device of this share of one core; None: all


def group_advantages(batch: Batch, eps: float = 1e-6) -> dict[str, float]:
    """Group-normalised advantage of every trajectory, by trajectory id."""
    out: dict[str, float] = {}
    for group in batch.groups().values():
        r = torch.tensor([t.reward for t in group], dtype=torch.float64)
        adv = (r - r.mean()) / (r.std(correction=0) + eps)
        out.update({t.id: float(a) for t, a in zip(group, adv, strict=True)})
    return out


class GRPOTrainer:
    """Owns the policy, its optimizer and the weights version it has reached."""

    def __init__(self, config: GRPOConfig | None = None, **overrides: Any) -> None:
        known = {f.name for f in fields(GRPOConfig)}
        if bad := sorted(set(overrides) - known):
            raise TrainerError(f"unknown GRPO option(s) {bad}; known: {sorted(known)}")
        self.cfg = cfg = replace(config or GRPOConfig(), **overrides)
        self.device = M.resolve_device(cfg.device)
        if cfg.dtype not in M.DTYPES:
            raise TrainerError(f"dtype {cfg.dtype!r} is not one of {list(M.DTYPES)}")
        self.dtype = M.DTYPES[cfg.dtype]
        self.hf_config, self._source = M.model_of(cfg.model_path, cfg.preset, cfg.seed)
        self.model: Any = M.build(
            config=self.hf_config, source=self._source, device=self.device, dtype=self.dtype
        ).train()
        self.ref: Any = None
        if cfg.kl_coef > 0:
            self.ref = M.build(
                config=self.hf_config, source=self._source, device=self.device, dtype=self.dtype
            ).eval()
            self.ref.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
        )
        self.version = cfg.start_version
        self.virtual_device = None if cfg.device_share is None else VirtualDevice(cfg.device_share)

    # -- logprobs --------------------------------------------------------------------------------

    def _pad(self, trajs: list[Trajectory], adv: dict[str, float]) -> dict[str, torch.Tensor]:
        """Right-padded tokens and attention; for the generated tokens (row-major order): where
        they are among the predicted positions, their ids, rollout logprobs and advantages."""
        n = max(t.n_tokens for t in trajs)
        pad = int(getattr(self.hf_config, "pad_token_id", 0) or 0)
        ids = torch.full((len(trajs), n), pad, dtype=torch.long)
        attn = torch.zeros((len(trajs), n), dtype=torch.long)
        mask = torch.zeros((len(trajs), n), dtype=torch.bool)
        old, advs = [], []
        for i, t in enumerate(trajs):
            k = t.n_tokens
            ids[i, :k] = torch.tensor(t.tokens())
            attn[i, :k] = 1
            mask[i, :k] = torch.tensor(t.loss_mask(), dtype=torch.bool)
            old += [x for u in t.turns for x in u.logprobs]
            advs += [adv.get(t.id, 0.0)] * t.n_generated
        sel = mask[:, 1:]  # position p predicts token p + 1; the first token is never generated
        d = self.device
        return {
            "ids": ids.to(d),
            "attn": attn.to(d),
            "sel": sel.to(d),
            "target": ids[:, 1:][sel].to(d),
            "old": torch.tensor(old).to(d),
            "adv": torch.tensor(advs).to(d),
        }

    def _logits(self, model: Any, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """Float32 logits [generated tokens, vocab]: the LM head runs only where a generated token
        is predicted (agentic trajectories are mostly observation tokens)."""
        h = model.model(input_ids=b["ids"][:, :-1], attention_mask=b["attn"][:, :-1])
        return model.lm_head(h.last_hidden_state[b["sel"]]).float()

    @torch.no_grad()
    def logprobs(self, trajectories: list[Trajectory]) -> list[list[float]]:
        """The current policy's logprob of every generated token, per trajectory, in order."""
        out: list[list[float]] = []
        for t in trajectories:
            b = self._pad([t], {})
            lp = torch.log_softmax(self._logits(self.model, b), -1)
            out.append(lp.gather(-1, b["target"][:, None])[:, 0].tolist())
        return out

    # -- the step --------------------------------------------------------------------------------

    def step(self, batch: Batch) -> dict[str, float]:
        """One GRPO update on ``batch``; returns its metrics. The version goes up by one."""
        t0 = time.perf_counter()
        if self.virtual_device is None:
            metrics = self._step(batch)
        else:
            with self.virtual_device.step():
                metrics = self._step(batch)
        metrics["seconds"] = time.perf_counter() - t0
        return metrics

    def _step(self, batch: Batch) -> dict[str, float]:
        cfg = self.cfg
        trajs = [t for t in batch.trajectories if t.n_generated > 0]
        if not trajs:
            raise TrainerError(f"batch of step {batch.step} has no generated token to train on")
        adv = group_advantages(batch, cfg.adv_eps)
        total = float(sum(t.n_generated for t in trajs))
        high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
        lo, hi = 1.0 - cfg.clip_eps, 1.0 + high
        sums = dict.fromkeys(
            ("loss", "pg_loss", "kl", "entropy", "clip_frac", "ratio", "rollout_kl"), 0.0
        )
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        for s in range(0, len(trajs), max(1, cfg.micro_batch)):
            b = self._pad(trajs[s : s + cfg.micro_batch], adv)
            A, target = b["adv"], b["target"][:, None]
            logp_all = torch.log_softmax(self._logits(self.model, b), -1)
            logp = logp_all.gather(-1, target)[:, 0]
            delta = logp - b["old"]
            ratio = torch.exp(delta)
            pg = -torch.minimum(ratio * A, ratio.clamp(lo, hi) * A)
            per_token = pg
            if self.ref is not None:
                with torch.no_grad():
                    ref = torch.log_softmax(self._logits(self.ref, b), -1).gather(-1, target)[:, 0]
                kl = torch.exp(ref - logp) - (ref - logp) - 1.0  # k3, unbiased and >= 0
                per_token = per_token + cfg.kl_coef * kl
                sums["kl"] += float(kl.detach().sum())
            if cfg.entropy_coef > 0:
                ent = -(logp_all.exp() * logp_all).sum(-1)
                per_token = per_token - cfg.entropy_coef * ent
                sums["entropy"] += float(ent.detach().sum())
            loss = per_token.sum() / total
            loss.backward()
            with torch.no_grad():
                clipped = ((ratio < lo) & (A < 0)) | ((ratio > hi) & (A > 0))
                sums["loss"] += float(loss) * total
                sums["pg_loss"] += float(pg.sum())
                sums["clip_frac"] += float(clipped.sum())
                sums["ratio"] += float(ratio.sum())
                sums["rollout_kl"] += float(-delta.sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        staleness = self.version - batch.min_version if batch.min_version >= 0 else 0
        self.version += 1
        rewards = [t.reward for t in batch.trajectories]
        mean_r = sum(rewards) / len(rewards)
        metrics = {k: v / total for k, v in sums.items()}
        metrics.update(
            reward_mean=mean_r,
            reward_std=math.sqrt(sum((r - mean_r) ** 2 for r in rewards) / len(rewards)),
            adv_abs_mean=sum(abs(a) for a in adv.values()) / max(1, len(adv)),
            tokens=total,
            trajectories=float(len(trajs)),
            groups=float(len(batch.groups())),
            grad_norm=float(grad_norm),
            staleness=float(staleness),
            version=float(self.version),
        )
        return metrics

    # -- weights ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """CPU copies of the current weights; tied tensors stay tied (saved once by the store)."""
        return cpu_state(self.model)

    def publish(self, store: WeightStore) -> Path:
        """Publish the current weights as ``self.version``."""
        return store.publish(self.version, self.state_dict())


__all__ = ["GRPOConfig", "GRPOTrainer", "TrainerError", "group_advantages"]
