"""The ``pearl`` command: one sub-command module per area, registered below.

Every sub-command module exposes ``register(subparsers)``; its handler returns an exit code.
A :class:`PearlError` becomes one clear line on stderr and exit code 1 or 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from pearl.core.errors import PearlError

# Sub-command modules under pearl.cli; each registers its own parsers.
COMMANDS = ("log", "decide", "keys", "remote", "simulate", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pearl", description="PEARL: elastic rollout runtime for asynchronous agentic RL"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"pearl.cli.{name}").register(sub)
    return parser


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
