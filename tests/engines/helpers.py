"""Engine factories and helpers for the engine tests: every engine kind, torch (tiny) and sim."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pearl.core.state import Role
from pearl.engines.base import Engine, GenerateRequest, GenerateResult, SamplingParams
from pearl.engines.sim import SimCost, SimEngine
from transports.bulk import ZmqKVChannel

# Sim costs scaled so one decode iteration takes ~0.6 ms of wall time (abort can land mid-way),
# and memory operations stay short.
SIM_COST = SimCost(
    start_s=0.2, activation_s=0.2, release_s=0.2, load_s=0.2, context_limit=8192, vocab_size=4096
)
SIM_SCALE = 0.05


def _torch(**kw: Any) -> Engine:
    from pearl.engines.torch import TorchEngine

    return TorchEngine(preset="tiny", **kw)


def _sim(**kw: Any) -> Engine:
    return SimEngine(cost=SIM_COST, time_scale=SIM_SCALE, **kw)


FACTORIES: dict[str, Callable[..., Engine]] = {"torch": _torch, "sim": _sim}


def new_weights(kind: str, seed: int) -> Any:
    """A weights source that differs from the engine's initial weights."""
    if kind == "sim":
        return {"seed": seed}  # the sim ignores the content; the version changes its tokens
    import torch

    from pearl.engines.torch import model as M

    cfg = M.preset_config("tiny")
    model = M.build(
        config=cfg,
        source=M.WeightSource("seed", seed),
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    return model.state_dict()


class Engines:
    """Builds engines and channels for one test and stops them all afterwards."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._engines: list[Engine] = []
        self._channels: list[ZmqKVChannel] = []

    def make(self, role: Role = Role.COLOCATED, start: bool = True, **kw: Any) -> Engine:
        if role is not Role.COLOCATED and "kv_channel" not in kw:
            kw["kv_channel"] = self.channel()
        e = FACTORIES[self.kind](role=role, **kw)
        self._engines.append(e)
        if start:
            e.start()
        return e

    def channel(self) -> ZmqKVChannel:
        ch = ZmqKVChannel()
        self._channels.append(ch)
        return ch

    def close(self) -> None:
        for e in self._engines:
            e.stop()
        for ch in self._channels:
            ch.close()


def run(
    engine: Engine, prompt: tuple[int, ...], rid: str = "r", timeout: float = 60.0, **sampling: Any
) -> GenerateResult:
    """Generate one request to completion."""
    sp = SamplingParams(**sampling)
    return engine.generate(GenerateRequest(rid=rid, input_ids=prompt, sampling=sp)).result(timeout)


def prompt_of(n: int, salt: int = 0) -> tuple[int, ...]:
    """A deterministic prompt of ``n`` byte tokens."""
    return tuple((7 * i + 13 * salt + 3) % 250 + 1 for i in range(n))
