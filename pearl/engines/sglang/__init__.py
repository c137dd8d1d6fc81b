"""The ``sglang`` engine: PEARL drives real SGLang servers over their HTTP API.

Importing this package never imports ``sglang`` itself: servers run as separate processes
(``python -m sglang.launch_server``), so the ``sglang`` extra is needed only where servers launch.
The same client drives the torch engine's SGLang-compatible facade (``pearl.engines.facade``).
"""

from pearl.engines.sglang.client import ServerInfo, SGLangClient, generate_pd
from pearl.engines.sglang.engine import SGLangEngine, SGLangEngineConfig
from pearl.engines.sglang.launch import (
    FACADE_MODULE,
    SGLANG_MODULE,
    ServerProcess,
    ServerSpec,
    launch_command,
)
from pearl.engines.sglang.protocol import Bootstrap, Endpoints
from pearl.engines.sglang.weights import DistributedWeights

__all__ = [
    "FACADE_MODULE",
    "SGLANG_MODULE",
    "Bootstrap",
    "DistributedWeights",
    "Endpoints",
    "SGLangClient",
    "SGLangEngine",
    "SGLangEngineConfig",
    "ServerInfo",
    "ServerProcess",
    "ServerSpec",
    "generate_pd",
    "launch_command",
]
