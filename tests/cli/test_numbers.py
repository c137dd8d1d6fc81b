"""Numbers as an operator types them: GPU lists and integers in ASCII digits, no empty items
(issue 41 item 12: ``--gpus 3,,4``, ``٣`` and ``1_000`` were taken as GPU ids)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pearl import config as config_mod
from pearl.cli import main
from pearl.core.errors import ConfigError

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "sim-32.toml"


@pytest.mark.parametrize(
    ("gpus", "words"),
    [
        ("3,,4", "'3,,4' has an empty item between commas"),
        ("3,", "has an empty item between commas"),
        (",3", "has an empty item between commas"),
        (
            "\u0663",
            "'\u0663' is not a GPU id or range like 0-15 (ASCII digits 0-9",
        ),  # Arabic-Indic 3
        ("1_000", "'1_000' is not a GPU id or range"),
        ("+3", "'+3' is not a GPU id or range"),
        ("2-\uff14", "is not a GPU id or range"),  # a fullwidth 4
    ],
)
def test_a_gpu_list_typed_wrong_is_refused_before_sending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpus: str, words: str
) -> None:
    argv = ["--endpoint", f"ipc://{tmp_path}/none.sock", "event", "gpus-added", "--gpus", gpus]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("pearl event: --gpus: ") and words in err and err.count("\n") == 1, err


@pytest.mark.parametrize("gpus", ["3,,4", "\u0663", "1_000"])
def test_the_config_refuses_them_too(gpus: str) -> None:
    with pytest.raises(ConfigError, match="cluster.reserved_gpus"):
        config_mod.load(CONFIG, [f'cluster.reserved_gpus="{gpus}"'])


def test_gpu_lists_as_written_still_parse() -> None:
    assert config_mod.parse_gpus(" 0 - 3, 8 ,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert config_mod.parse_gpus("") == config_mod.parse_gpus("  ") == ()


@pytest.mark.parametrize(
    "argv",
    [
        ["decide", "--gpus", "\u0663"],
        ["decide", "--gpus", "1_000"],
        ["decide", "--gpus", "8", "--overlap-gpus", "\uff18"],
        ["event", "training-begin", "--step", "1_000"],
        ["event", "training-finished", "--step", "1", "--weights-version", "\u0663"],
    ],
)
def test_an_integer_flag_takes_ascii_digits_only(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "is not an integer in ASCII digits 0-9" in capsys.readouterr().err
