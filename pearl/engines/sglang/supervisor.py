"""Keeps one SGLang server alive: see :class:`pearl.engines.process.Watchdog`."""

from pearl.engines.process import Watchdog

__all__ = ["Watchdog"]
