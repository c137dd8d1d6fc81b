"""The remote CLI's key handling, without a daemon."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pearl.cli.remote import _reachable, client
from pearl.core.errors import PearlError


def test_a_wildcard_change_stream_is_reached_where_the_api_was() -> None:
    assert _reachable("tcp://0.0.0.0:5001", "tcp://10.0.0.7:7440") == "tcp://10.0.0.7:5001"
    assert _reachable("tcp://[::]:5001", "tcp://node-3:7440") == "tcp://node-3:5001"
    assert _reachable("tcp://127.0.0.1:5001", "tcp://127.0.0.1:7440") == "tcp://127.0.0.1:5001"
    assert _reachable("ipc:///tmp/a.sock.pub", "ipc:///tmp/a.sock") == "ipc:///tmp/a.sock.pub"


def test_a_bad_keys_dir_names_the_option(tmp_path: Path) -> None:
    args = argparse.Namespace(endpoint="tcp://127.0.0.1:1", keys_dir=str(tmp_path), timeout=0.1)
    with pytest.raises(PearlError, match=r"check --keys-dir: .*client\.key_secret"):
        client(args)
