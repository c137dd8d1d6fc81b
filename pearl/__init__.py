"""PEARL: an elastic rollout runtime for asynchronous agentic RL."""

from pearl.core.errors import PearlError

__version__ = "0.1.0"

__all__ = ["PearlError", "__version__"]
