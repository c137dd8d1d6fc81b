"""Weight sources of the sglang engine: model directories, safetensors files, NCCL broadcasts.

SGLang's ``/update_weights_from_disk`` loads a Hugging Face model *directory*; PEARL's weight store
publishes one safetensors file per version. :func:`overlay_model_dir` bridges the two: a directory
of links to the base model's config and tokenizer files plus the new weights file.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from pearl.engines.base import EngineError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class DistributedWeights:
    """A weight update broadcast by the trainer (rank 0 of an initialised update group)."""

    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    group_name: str = "weight_update_group"


def check_source(source: object) -> None:
    """Raise EngineError unless ``source`` is something the sglang engine can load."""
    if isinstance(source, DistributedWeights):
        return
    if not isinstance(source, str | Path) or not Path(source).exists():
        raise EngineError(
            f"sglang loads weights from a directory, a safetensors file or a "
            f"DistributedWeights broadcast; got {type(source).__name__} {source!r}"
        )


def overlay_model_dir(base: str, weights_file: Path) -> Path:
    """A fresh directory: ``base``'s non-weight files linked, ``weights_file`` as the weights.

    A ``base`` that is not a directory (a preset name of the torch facade) contributes nothing.
    """
    out = Path(tempfile.mkdtemp(prefix="pearl-weights-"))
    src = Path(base)
    if src.is_dir():
        for f in src.iterdir():
            if f.is_file() and f.suffix not in WEIGHT_SUFFIXES and "index" not in f.name:
                (out / f.name).symlink_to(f.resolve())
    if weights_file.suffix not in WEIGHT_SUFFIXES:
        raise EngineError(f"{weights_file} is not a weights file ({', '.join(WEIGHT_SUFFIXES)})")
    (out / f"model{weights_file.suffix}").symlink_to(weights_file.resolve())
    return out


__all__ = ["WEIGHT_SUFFIXES", "DistributedWeights", "check_source", "overlay_model_dir"]
