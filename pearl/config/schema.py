"""The whole configuration: one frozen section per TOML table."""

from __future__ import annotations

from dataclasses import dataclass, field

from pearl.config.cluster import ClusterConfig
from pearl.config.daemon import DaemonConfig, RayConfig
from pearl.config.decision import DecisionConfig, GateConfig
from pearl.config.engine import EngineConfig
from pearl.config.gateway import GatewayConfig
from pearl.config.rl import DemoConfig, RLConfig
from pearl.config.validate import check
from pearl.config.workload import ModelConfig, WorkloadConfig


@dataclass(frozen=True)
class Config:
    """Everything pearld, ``pearl`` and the embedded Runtime read: ``[cluster]``, ``[engine]``
    and the rest, each a frozen section (docs/configuration.md)."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    decision: DecisionConfig = field(default_factory=DecisionConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)

    def validate(self) -> Config:
        """``self`` when every key is in range and the sections agree; else ConfigError."""
        check(self)
        return self


__all__ = ["Config"]
