"""PEARL: an elastic rollout runtime for asynchronous agentic RL."""

from pearl.core.errors import PearlError
from pearl.runtime import RemoteRuntime, Runtime, connect

__version__ = "0.1.0"

__all__ = ["PearlError", "RemoteRuntime", "Runtime", "__version__", "connect"]
