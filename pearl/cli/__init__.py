"""The ``pearl`` command: one sub-command module per area, registered below.

Every sub-command module exposes ``register(subparsers)``; its handler returns an exit code.
A :class:`PearlError` becomes one clear line on stderr and exit code 1 or 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from pearl.core.errors import PearlError

# Sub-command modules under pearl.cli; each registers its own parsers.
COMMANDS = ("log", "decide", "keys", "remote", "top", "simulate", "demo")
# One example line for every command's --help (tests/cli check that none is missing).
EXAMPLES = {
    "log verify": "pearl log verify state/log",
    "log show": "pearl log show state/log --from 120 --json",
    "log replay": "pearl log replay state/log --until 120",
    "decide": "pearl decide --config configs/sim-32.toml --gpus 24",
    "keys generate": "pearl keys generate keys/",
    "event gpus-added": "pearl event gpus-added --gpus 20-23",
    "event gpus-reclaimed": "pearl --endpoint tcp://node0:7450 event gpus-reclaimed --gpus 20,21",
    "event gpus-reclaiming": "pearl event gpus-reclaiming --gpus 20-23 --deadline 30s",
    "event gpus-reclaim-cancelled": "pearl event gpus-reclaim-cancelled --gpus 20-23",
    "event training-begin": "pearl event training-begin --step 7",
    "event training-finished": "pearl event training-finished --step 7 --weights-version 7",
    "status": "pearl --endpoint ipc:///tmp/pearld.sock status --json",
    "watch": "pearl watch --count 10",
    "top": "pearl top --interval 2",
    "simulate": "pearl simulate --model qwen3-8b --segment S1",
    "demo": "pearl demo --steps 8",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pearl", description="PEARL: elastic rollout runtime for asynchronous agentic RL"
    )
    from pearl.cli.remote import connection_options

    connection_options(parser, top=True)  # `pearl --endpoint X status` as well as after it
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"pearl.cli.{name}").register(sub)
    for path, p in commands(parser):
        if path in EXAMPLES:
            p.epilog = f"example: {EXAMPLES[path]}"
    return parser


def commands(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, Any]]:
    """Every runnable command under ``parser``: (its words, e.g. "event gpus-added", parser)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    return [
        leaf
        for name, p in subs[0].choices.items()
        for leaf in commands(p, f"{path} {name}".strip())
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except PearlError as e:
        print(f"pearl {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"pearl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
