"""``pearl keys generate DIR``: every CURVE key a deployment needs, in one directory.

With no other flags it writes the server key pair (pearld), the worker hosts' key pair and one
client key pair (``client``, for the CLI and trainers), plus the directory of client public keys
pearld accepts (see :mod:`transports.auth` for the layout); ``--client NAME`` writes other client
key pairs. Secret files are mode 0600. Then ``pearld --set daemon.keys_dir=DIR`` hands the worker
hosts their keys, and ``pearl --keys-dir DIR`` clients connect.
"""

from __future__ import annotations

import argparse

from pearl.cli.args import Subparsers
from transports.auth import AUTHORIZED_DIR, CLIENT, WORKER, generate


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("keys", help="CURVE keys for pearld, its worker hosts and clients")
    sub = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    g = sub.add_parser(
        "generate",
        help="write server, worker host and client key pairs to DIR",
        description="Write every key a deployment needs: the server key pair, the worker hosts' "
        f"key pair ({WORKER}) and a client key pair ({CLIENT}). Run again on an existing DIR to "
        "add what is missing or other clients (--client NAME). Start pearld with "
        "`--set daemon.keys_dir=DIR`; clients pass `--keys-dir DIR`.",
    )
    g.add_argument("dir", help="key directory (created; mode 0700)")
    g.add_argument(
        "--client",
        dest="clients",
        action="append",
        metavar="NAME",
        help=f"client key pair name (repeatable; default: {CLIENT}); the worker hosts' key pair "
        "is written anyway",
    )
    g.add_argument("--force", action="store_true", help="replace existing keys")
    g.set_defaults(handler=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    written = generate(args.dir, tuple(args.clients) if args.clients else None, force=args.force)
    for path in written:
        print(path)
    d = args.dir
    print(
        f"pearld: pearld --set daemon.keys_dir={d} (reads {d}/server.key_secret and accepts the "
        f"public keys in {d}/{AUTHORIZED_DIR}/); its worker hosts read {d}/{WORKER}.key_secret\n"
        f"clients: pearl status --keys-dir {d} (reads {d}/server.key and {d}/{CLIENT}.key_secret;"
        " copy those two to a client machine)"
    )
    return 0


__all__ = ["cmd_generate", "register"]
