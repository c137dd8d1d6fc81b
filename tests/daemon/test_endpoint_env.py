"""pearld finds its endpoint as ``pearl`` does: ``--endpoint``, else ``PEARL_ENDPOINT``, else the
config's ``daemon.endpoint``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pearl.daemon import build_parser
from tests.daemon.conftest import SMALL, Pearld


def test_the_flag_wins_over_the_environment_which_wins_over_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PEARL_ENDPOINT", raising=False)
    assert build_parser().parse_args([]).endpoint is None  # the Daemon takes daemon.endpoint
    monkeypatch.setenv("PEARL_ENDPOINT", "")
    assert build_parser().parse_args([]).endpoint is None  # empty is unset
    monkeypatch.setenv("PEARL_ENDPOINT", "ipc:///tmp/from-env.sock")
    assert build_parser().parse_args([]).endpoint == "ipc:///tmp/from-env.sock"
    flag = build_parser().parse_args(["--endpoint", "tcp://127.0.0.1:7999"])
    assert flag.endpoint == "tcp://127.0.0.1:7999"
    assert "$PEARL_ENDPOINT" in build_parser().format_help()


@dataclass
class PearldFromEnv(Pearld):
    """pearld started with no ``--endpoint``: PEARL_ENDPOINT names where it listens."""

    def command(self, endpoint: str) -> list[str]:
        argv = super().command(endpoint)
        i = argv.index("--endpoint")
        return argv[:i] + argv[i + 2 :]


@pytest.mark.slow
def test_pearld_listens_where_pearl_endpoint_says(tmp_path: Path) -> None:
    # the config says another address; the environment wins, as it does for `pearl`
    d = PearldFromEnv(tmp_path, [*SMALL, f"daemon.endpoint=ipc://{tmp_path}/config.sock"])
    d.env = {"PEARL_ENDPOINT": d.endpoint}
    try:
        d.start()
        assert d.status()["workers"]
        assert not (tmp_path / "config.sock").exists()
    finally:
        d.cleanup()
