"""A versioned weight store: one snapshot per training step, published atomically.

``publish(version, weights)`` writes ``v{version:08d}.safetensors`` (a state dict) or copies a
given file (``.safetensors`` kept, anything else saved as ``.pt``, which the torch engine reads
with ``torch.load(weights_only=True)``) or a model directory, through a temporary name, fsync,
rename and a directory fsync, so a reader only ever sees complete snapshots. Every file is
loadable by ``TorchEngine.load_weights(version, store.path(version))``. Versions only go forward;
the newest ``keep`` are kept. Workers propagate lazily: they ask ``latest()`` before admission.

A reader that opened a snapshot keeps reading it after it is pruned (POSIX unlink); one that asks
for a pruned version gets a clear error and should fetch ``latest()`` instead.
:func:`latest_snapshot` is that reader's view (no store is opened, nothing is created or removed):
a worker host joining at any phase of a step loads it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pearl.core.bounds import version_problem
from pearl.core.errors import PearlError

if TYPE_CHECKING:  # readers (path, latest) need no torch; publishing a state dict imports it
    import torch

_NAME = re.compile(r"^v(\d{8,})(\.safetensors|\.pt)?$")


class WeightStoreError(PearlError):
    """A snapshot cannot be published or found (older version, missing file, bad source)."""


class WeightStore:
    """Snapshots in one directory, by version; safe for one writer and many readers."""

    def __init__(self, root: str | Path, keep: int = 3) -> None:
        if keep < 1:
            raise WeightStoreError(f"keep must be at least 1, got {keep}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self._lock = threading.Lock()
        for stale in self.root.glob(".tmp-*"):  # a publish interrupted by a crash
            _remove(stale)

    def versions(self) -> list[int]:
        """Published versions still on disk, oldest first."""
        return sorted(self._scan())

    def latest(self) -> int | None:
        """The newest published version (None when nothing is published)."""
        found = self._scan()
        return max(found) if found else None

    def path(self, version: int) -> Path:
        """The snapshot of ``version``: a file, or a model directory."""
        found = self._scan()
        if version not in found:
            have = sorted(found)
            raise WeightStoreError(
                f"weights version {version} is not in {self.root} (have "
                f"{have}); it was never published or was pruned — load "
                "latest() instead"
            )
        return found[version]

    def latest_path(self) -> tuple[int, Path] | None:
        v = self.latest()
        return None if v is None else (v, self.path(v))

    def publish(self, version: int, weights: Mapping[str, torch.Tensor] | str | Path) -> Path:
        """Write ``version`` once, atomically; older or equal versions are refused."""
        why = version_problem(version)  # before a file is written no log record could name
        if why is not None:
            raise WeightStoreError(why)
        with self._lock:
            latest = self.latest()
            if latest is not None and version <= latest:
                raise WeightStoreError(
                    f"weights version {version} is not newer than the latest "
                    f"published version {latest}; versions only go forward"
                )
            if isinstance(weights, str | Path):
                final = self._publish_path(version, Path(weights))
            elif isinstance(weights, Mapping):
                final = self.root / f"v{version:08d}.safetensors"
                self._write(final, lambda tmp: _save_state(weights, tmp, version))
            else:
                raise WeightStoreError(
                    f"publish takes a state dict or a path, got {type(weights).__name__}"
                )
            self._prune()
            return final

    # -- internals -------------------------------------------------------------------------------

    def _publish_path(self, version: int, src: Path) -> Path:
        if src.is_dir():
            final = self.root / f"v{version:08d}"
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
            try:
                shutil.copytree(src, tmp, dirs_exist_ok=True)
                for f in tmp.rglob("*"):
                    if f.is_file():
                        _fsync_file(f)
                os.replace(tmp, final)
            except BaseException:
                _remove(tmp)
                raise
            _fsync_dir(self.root)
            return final
        if not src.is_file():
            raise WeightStoreError(f"weights source {src} does not exist")
        suffix = ".safetensors" if src.suffix == ".safetensors" else ".pt"
        final = self.root / f"v{version:08d}{suffix}"
        self._write(final, lambda tmp: shutil.copyfile(src, tmp))
        return final

    def _write(self, final: Path, write: Callable[[Path], object]) -> None:
        fd, name = tempfile.mkstemp(prefix=".tmp-", suffix=final.suffix, dir=self.root)
        os.close(fd)
        tmp = Path(name)
        try:
            write(tmp)
            _fsync_file(tmp)
            os.replace(tmp, final)
        except BaseException:
            _remove(tmp)
            raise
        _fsync_dir(self.root)

    def _scan(self) -> dict[int, Path]:
        return _snapshots(self.root)

    def _prune(self) -> None:
        for v in self.versions()[: -self.keep]:
            _remove(self.path(v))
        _fsync_dir(self.root)


def latest_snapshot(root: str | Path) -> tuple[int, Path] | None:
    """The newest complete snapshot in ``root`` and its version, read-only; None when nothing is
    published there (yet). A publish still being written is not seen (it has a temporary name)."""
    found = _snapshots(Path(root))
    if not found:
        return None
    v = max(found)
    return v, found[v]


def cpu_state(model: Any) -> dict[str, torch.Tensor]:
    """CPU copies of a module's weights, to publish; tied tensors stay tied (one copy, which the
    store saves once)."""
    copies: dict[tuple[Any, ...], torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in copies:
            copies[key] = t.detach().to("cpu", copy=True)
        out[name] = copies[key]
    return out


def _snapshots(root: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:  # nothing was ever published
        return found
    for p in entries:
        m = _NAME.match(p.name)
        if m and (m.group(2) is None) == p.is_dir():
            found[int(m.group(1))] = p
    return found


def _save_state(state: Mapping[str, torch.Tensor], path: Path, version: int) -> None:
    """safetensors of a state dict; tensors sharing storage (tied embeddings) are saved once."""
    import torch
    from safetensors.torch import save_file

    seen: set[tuple[Any, ...]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise WeightStoreError(
                f"state dict entry {name!r} is a {type(t).__name__}, not a tensor"
            )
        key = (
            (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            if t.numel()
            else (id(t),)
        )
        if key in seen:
            continue  # tied to an earlier entry: load_state_dict fills it through the tie
        seen.add(key)
        out[name] = t.detach().to("cpu").contiguous()
    save_file(out, str(path), metadata={"pearl_weights_version": str(version)})


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


__all__ = ["WeightStore", "WeightStoreError", "cpu_state", "latest_snapshot"]
