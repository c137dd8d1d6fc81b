"""pearl.config: every number in range (finite; > 0 or >= 0 where the key says so), and files a
config names read with a size limit (issue 41 item 11: ``daemon.tick_s = nan`` busy-looped the
ticker, ``inf`` killed it, ``gateway.api_key_file = /dev/zero`` blocked the start forever)."""

from __future__ import annotations

import dataclasses
import os
import threading
import typing
from pathlib import Path

import pytest

from pearl import config as config_mod
from pearl.config import NON_NEGATIVE, POSITIVE, Config, read_small_file
from pearl.core.errors import ConfigError
from pearl.gateway.serve import read_api_key

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "sim-32.toml"


def keys(kind: type, cls: type = Config, prefix: str = "") -> list[str]:
    """Every ``section.key`` (``engine.vllm.port`` in a nested table) of the schema whose type
    is ``kind`` (optional or not)."""
    out = []
    for f, tp in typing.get_type_hints(cls).items():
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += keys(kind, tp, f"{prefix}{f}.")
        elif tp is kind or set(typing.get_args(tp)) == {kind, type(None)}:
            out.append(f"{prefix}{f}")
    return out


def refused(*sets: str) -> str:
    with pytest.raises(ConfigError) as e:
        config_mod.load(CONFIG, list(sets))
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize(
    "override, words",
    [
        ("daemon.tick_s=nan", "daemon.tick_s: expected a finite number, got nan"),
        ("daemon.tick_s=inf", "daemon.tick_s: expected a finite number, got inf"),
        ("daemon.tick_s=1e300", "daemon.tick_s must be at most 31536000 s (a year)"),
        ("daemon.heartbeat_s=nan", "daemon.heartbeat_s: expected a finite number, got nan"),
        ("daemon.snapshot_every=-5", "daemon.snapshot_every must be >= 1, got -5"),
        ("daemon.snapshot_every=0", "daemon.snapshot_every must be >= 1, got 0"),
        ("daemon.restart_budget=-1", "daemon.restart_budget must be >= 0, got -1"),
        ("gateway.request_timeout_s=-inf", "expected a finite number, got -inf"),
        ("gateway.request_timeout_s=0", "gateway.request_timeout_s must be > 0, got 0"),
    ],
)
def test_the_issues_values_are_refused_in_one_line(override: str, words: str) -> None:
    msg = refused(override)
    assert words in msg and "set " in msg, msg  # what came, what was expected, what to do


@pytest.mark.parametrize("key", keys(float))
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_float_key_must_be_finite(key: str, value: str) -> None:
    assert f"{key}: expected a finite number, got {value}" in refused(f"{key}={value}")


@pytest.mark.parametrize("key", keys(float))
def test_a_section_built_in_code_is_checked_too(key: str) -> None:
    """The same rule holds for a Config built without TOML (an embedding trainer's)."""
    *tables, name = key.split(".")

    def spoil(section: object, path: list[str]) -> object:
        if not path:
            return dataclasses.replace(section, **{name: float("nan")})  # type: ignore[type-var]
        inner = spoil(getattr(section, path[0]), path[1:])
        return dataclasses.replace(section, **{path[0]: inner})  # type: ignore[type-var]

    bad = spoil(config_mod.load(CONFIG), tables)
    with pytest.raises(ConfigError, match=rf"^{key} must be a finite number, got nan"):
        bad.validate()  # type: ignore[attr-defined]


@pytest.mark.parametrize("key", [f"{s}.{k}" for s, ks in POSITIVE.items() for k in ks])
def test_positive_keys_refuse_zero_and_negatives(key: str) -> None:
    assert f"{key} must be" in refused(f"{key}=0")
    assert f"{key} must be" in refused(f"{key}=-1")


@pytest.mark.parametrize("key", [f"{s}.{k}" for s, ks in NON_NEGATIVE.items() for k in ks])
def test_non_negative_keys_take_zero_and_refuse_negatives(key: str) -> None:
    assert f"{key} must be >= 0, got -1" in refused(f"{key}=-1")
    config_mod.load(CONFIG, [f"{key}=0"])


def test_the_range_keys_exist() -> None:
    every = set(keys(float)) | set(keys(int))
    for table in (POSITIVE, NON_NEGATIVE):
        for section, names in table.items():
            assert {f"{section}.{k}" for k in names} <= every


def test_a_device_as_the_api_key_file_is_refused_at_once() -> None:
    done = threading.Event()
    errors: list[str] = []

    def read() -> None:
        try:
            read_api_key("/dev/zero")
        except ConfigError as e:
            errors.append(str(e))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(10), "reading /dev/zero as an API key blocked"
    assert errors == ["gateway.api_key_file = '/dev/zero': not a regular file "
                      "(a device, FIFO or directory); name a file"]  # fmt: skip


def test_a_fifo_and_a_directory_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)  # opened for reading without a writer, it would wait forever
    with pytest.raises(ConfigError, match="not a regular file"):
        read_small_file(fifo, "gateway.api_key_file")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_small_file(tmp_path, "gateway.api_key_file")


def test_files_are_read_up_to_their_limit(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_bytes(b"k" * 100)
    assert read_small_file(f, "gateway.api_key_file", limit=100) == "k" * 100
    with pytest.raises(ConfigError, match="larger than 99 bytes"):
        read_small_file(f, "gateway.api_key_file", limit=99)
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        read_small_file(f, "gateway.api_key_file")
    with pytest.raises(ConfigError, match="cannot read it"):
        read_small_file(tmp_path / "missing", "gateway.api_key_file")


def test_the_config_file_is_bounded_too() -> None:
    with pytest.raises(ConfigError, match="--config = '/dev/zero': not a regular file"):
        config_mod.load("/dev/zero")
