"""One typed configuration schema, loaded from TOML, with ``--set section.key=value`` overrides.

Each section is a frozen dataclass in a module of its own (``cluster``, ``engine``, ``daemon``,
...); ``[engine]`` holds a table per engine (``[engine.vllm]``, ``--set engine.vllm.port=1``).
Unknown sections or keys are errors that suggest the closest valid name, and the flat engine keys
of before name the key they moved to. GPU lists accept arrays of ids or range strings such as
``"0-15"`` or ``"16-19,24"``. ``loader`` reads files and overrides, ``coerce`` types their values,
``ranges`` and ``validate`` check them.
"""

from __future__ import annotations

from pearl.config.cluster import ClusterConfig, NodeConfig
from pearl.config.daemon import DEFAULT_ENDPOINT, DaemonConfig, Launcher, RayConfig
from pearl.config.decision import DecisionConfig, GateConfig
from pearl.config.engine import (
    MOVED,
    EngineConfig,
    EngineKind,
    RoleSwitch,
    RouterKind,
    SGLangConfig,
    SimConfig,
    TorchConfig,
    VllmConfig,
)
from pearl.config.files import MAX_CONFIG_BYTES, MAX_FILE_BYTES, read_small_file
from pearl.config.gateway import GatewayConfig
from pearl.config.gpus import GpuList, available_cores, format_gpus, parse_gpus
from pearl.config.loader import from_mapping, load, parse_override
from pearl.config.ranges import MAX_SECONDS, NON_NEGATIVE, POSITIVE
from pearl.config.rl import DemoConfig, RLConfig, parse_budget
from pearl.config.schema import Config
from pearl.config.workload import ModelConfig, WorkloadConfig

__all__ = [
    "DEFAULT_ENDPOINT",
    "MAX_CONFIG_BYTES",
    "MAX_FILE_BYTES",
    "MAX_SECONDS",
    "MOVED",
    "NON_NEGATIVE",
    "POSITIVE",
    "ClusterConfig",
    "Config",
    "DaemonConfig",
    "DecisionConfig",
    "DemoConfig",
    "EngineConfig",
    "EngineKind",
    "GateConfig",
    "GatewayConfig",
    "GpuList",
    "Launcher",
    "ModelConfig",
    "NodeConfig",
    "RLConfig",
    "RayConfig",
    "RoleSwitch",
    "RouterKind",
    "SGLangConfig",
    "SimConfig",
    "TorchConfig",
    "VllmConfig",
    "WorkloadConfig",
    "available_cores",
    "format_gpus",
    "from_mapping",
    "load",
    "parse_budget",
    "parse_gpus",
    "parse_override",
    "read_small_file",
]
