"""One error root for PEARL, and the few subclasses callers act on differently.

Messages say what was expected, what came, and what to do.
"""

from __future__ import annotations


class PearlError(Exception):
    """Root of every error PEARL raises on purpose."""


class ConfigError(PearlError):
    """A configuration file or override is invalid."""


class InsecureBind(ConfigError):
    """A socket would listen on a non-local address without CURVE keys (or, for the metrics
    port, without ``daemon.metrics_public``)."""


class SchemaError(PearlError):
    """A record or message does not match its schema (wrong kind, version, field or type)."""


class ProtocolError(PearlError):
    """A peer sent something the wire protocol does not allow."""


class InvariantViolation(PearlError):
    """A table update would break an invariant of the GPU-worker-role table; nothing was changed."""


class InvalidEvent(InvariantViolation):
    """An elastic event does not fit the current state (unknown GPU, training-begin twice, ...)."""


class InvalidNotice(InvalidEvent):
    """A preemption notice (gpus-reclaiming / gpus-reclaim-cancelled) does not fit: GPUs not
    present, a deadline in the past or too far ahead, a second notice for the same GPUs."""


class InfeasibleConfiguration(PearlError):
    """No configuration satisfies the capacity constraints for the current budget."""


class LogError(PearlError):
    """The event log cannot be opened or written."""


class NotALog(LogError):
    """The directory does not exist or holds no PEARL event log."""


class LogCorrupted(LogError):
    """The log is damaged in a way replay must not paper over (names file and offset)."""


class LogLocked(LogError):
    """Another process holds the log open for writing."""


class LogWriteFailed(LogError):
    """An append was not acknowledged because the disk failed it (full, I/O error). Its message
    says whether the log is exactly as before the append (the usual case) or, when even the cut
    back failed, unknown until the log is reopened."""


class EngineError(PearlError):
    """An engine cannot do what was asked (wrong role, busy, released, older weights, ...)."""


class KVTimeout(EngineError):
    """A decode worker never received the KV cache of a request; the router should retry."""


class RequestRefused(EngineError):
    """The server refused the request itself (an HTTP 4xx, a prompt it cannot serve): final for
    that request, never retried; the gateway answers it with 400 and the server's reason."""


class NoWorker(EngineError):
    """No worker served the request within its time (its worker died and none came back, none
    can start, the pool is empty): transient, try again after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
