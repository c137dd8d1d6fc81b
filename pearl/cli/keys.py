"""``pearl keys generate DIR``: CURVE keys for sockets that listen beyond loopback.

Writes the server key pair, one key pair per client name, and the directory of client public keys
the server accepts (see :mod:`transports.auth` for the layout). Secret files are mode 0600.
"""

from __future__ import annotations

import argparse
from typing import Any

from transports.auth import AUTHORIZED_DIR, generate


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("keys", help="CURVE keys for non-loopback sockets")
    sub = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    g = sub.add_parser("generate", help="write a server key pair and client key pairs to DIR")
    g.add_argument("dir", help="key directory (created; mode 0700)")
    g.add_argument(
        "--client",
        dest="clients",
        action="append",
        metavar="NAME",
        help="client key pair name (repeatable; default: client)",
    )
    g.add_argument("--force", action="store_true", help="replace existing keys")
    g.set_defaults(handler=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    clients = tuple(args.clients or ("client",))
    written = generate(args.dir, clients, force=args.force)
    for path in written:
        print(path)
    print(
        f"server: keep {args.dir}/server.key_secret; it accepts the public keys in "
        f"{args.dir}/{AUTHORIZED_DIR}/\n"
        f"client: copy {args.dir}/server.key and {args.dir}/<name>.key_secret to the client"
    )
    return 0


__all__ = ["cmd_generate", "register"]
