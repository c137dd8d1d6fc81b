"""The pearl command line as users try it: the endpoint before or after the command, and an
example in every command's --help."""

from __future__ import annotations

from pathlib import Path

import pytest

from pearl.cli import EXAMPLES, build_parser, commands, main
from pearl.config import DEFAULT_ENDPOINT


def test_every_command_has_an_example_in_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    paths = [path for path, _ in commands(parser)]
    assert "event gpus-added" in paths and "status" in paths and "log verify" in paths
    assert sorted(paths) == sorted(EXAMPLES), "a command without an example, or a stale one"
    for path in paths:
        with pytest.raises(SystemExit):
            main([*path.split(), "--help"])
        out = capsys.readouterr().out
        assert f"example: {EXAMPLES[path]}" in " ".join(out.split()), path
        assert EXAMPLES[path].startswith("pearl ")


@pytest.mark.parametrize(
    ("argv", "endpoint"),
    [
        (["status"], DEFAULT_ENDPOINT),
        (["--endpoint", "ipc:///tmp/a.sock", "status"], "ipc:///tmp/a.sock"),
        (["status", "--endpoint", "ipc:///tmp/b.sock"], "ipc:///tmp/b.sock"),
        (
            ["--endpoint", "ipc:///tmp/a.sock", "status", "--endpoint", "ipc:///tmp/b.sock"],
            "ipc:///tmp/b.sock",
        ),  # the one nearest the command wins
        (
            ["--endpoint", "ipc:///tmp/a.sock", "event", "gpus-added", "--gpus", "8"],
            "ipc:///tmp/a.sock",
        ),
    ],
)
def test_the_endpoint_goes_before_or_after_the_command(
    argv: list[str], endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PEARL_ENDPOINT", raising=False)
    args = build_parser().parse_args(argv)
    assert args.endpoint == endpoint and args.keys_dir == ""


def test_a_global_endpoint_is_the_one_dialled(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--endpoint", "tcp://127.0.0.1:1", "status", "--timeout", "0.2"])
    assert rc != 0
    assert "tcp://127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted(EXAMPLES))
def test_every_example_is_a_valid_command_line(path: str) -> None:
    args = build_parser().parse_args(EXAMPLES[path].split()[1:])
    assert callable(args.handler)


def test_demo_refuses_a_directory_that_holds_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replaying an old run's log into a new one would adopt hosts that are gone: a clear error
    before anything starts, and the old run is left as it was."""
    run = tmp_path / "run"
    (run / "state" / "log").mkdir(parents=True)
    assert main(["demo", "--out", str(run), "--steps", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"{run} already holds a demo run" in err and "choose another --out" in err
    assert sorted(p.name for p in run.rglob("*")) == ["log", "state"]
