"""docs/configuration.md is rendered from pearl/config.py and cannot drift from it."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from pearl import config as C
from pearl import config_reference as ref


def test_the_reference_in_docs_is_the_one_the_schema_renders() -> None:
    assert ref.DOC.read_text() == ref.reference(), (
        "docs/configuration.md is out of date: run python -m pearl.config_reference"
    )


def test_every_key_has_a_row_with_its_default() -> None:
    text = ref.reference()
    hints = typing.get_type_hints(C.Config)
    for section in dataclasses.fields(C.Config):
        for name, cls in ref.tables(hints[section.name], section.name):
            for f, tp in typing.get_type_hints(cls).items():
                nested = isinstance(tp, type) and dataclasses.is_dataclass(tp)
                assert (f"## [{name}.{f}]" if nested else f"| `{name}.{f}` |") in text
    assert '| `engine.kind` | `sim` \\| `torch` \\| `sglang` \\| `vllm` | `"sim"` |' in text
    assert '| `cluster.training_gpus` | GPU ids | `"0-15"` |' in text
    assert "| `cluster.nodes[].label` | string |" in text
    assert '| `engine.vllm.model_path` | string | `""` |' in text
    assert "| `engine.torch.device_share` | float, optional | unset |" in text


def test_a_key_without_a_description_is_an_error() -> None:
    @dataclasses.dataclass(frozen=True)
    class Section:
        documented: int = 1
        """A documented key."""
        bare: int = 2

    assert ref.field_docs(Section) == {"documented": "A documented key."}
    with pytest.raises(ValueError, match="section.bare has no docstring"):
        ref.rows(Section, "section")


def test_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(ref.reference().replace("GPUs per worker", "GPUs each worker"))
    assert ref.main(["--check", str(stale)]) == 1
    assert ref.main([str(stale)]) == 0 and ref.main(["--check", str(stale)]) == 0
