"""Files a config names (an API key) and the config file itself, read with a size limit."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pearl.core.errors import ConfigError

MAX_FILE_BYTES = 64 << 10
"""Largest file a config names (an API key) that PEARL reads."""
MAX_CONFIG_BYTES = 1 << 20
"""Largest config file PEARL reads."""


def read_small_file(path: str | Path, where: str, limit: int = MAX_FILE_BYTES) -> str:
    """The text of the regular file ``path``, at most ``limit`` bytes. A device (``/dev/zero``),
    a FIFO or a directory is refused before it is read (it could block the start forever, or
    never end), and so is a larger file: one :class:`ConfigError` line naming ``where``."""
    shown = f"{where} = {str(path)!r}"
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; reads of a regular file ignore it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{shown}: cannot read it ({e.strerror or e})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{shown}: not a regular file (a device, FIFO or directory); name a file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise ConfigError(f"{shown}: cannot read it ({e.strerror or e})") from None
    if len(data) > limit:
        raise ConfigError(f"{shown}: larger than {limit} bytes; name the right file")
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{shown}: not UTF-8 text ({e.reason} at byte {e.start})") from None


__all__ = ["MAX_CONFIG_BYTES", "MAX_FILE_BYTES", "read_small_file"]
