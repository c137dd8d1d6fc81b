"""The command registry: commands and reports are two disjoint unions covering every kind."""

from __future__ import annotations

import typing

from pearl.core import commands as cmd
from pearl.core.controller import Input


def test_commands_and_reports_are_every_registered_kind_once() -> None:
    commands, reports = set(typing.get_args(cmd.Command)), set(typing.get_args(cmd.Report))
    assert not commands & reports
    assert commands | reports == set(cmd.COMMANDS.kinds.values())
    assert set(cmd.STEP_COMMANDS) <= commands


def test_the_controller_takes_every_report_and_sends_no_command_to_itself() -> None:
    inputs = set(typing.get_args(Input))
    assert set(typing.get_args(cmd.Report)) <= inputs
    assert not inputs & set(typing.get_args(cmd.Command))
