"""`caldera init BLUEPRINT [--name NAME] [--user ACCOUNT | --owner USER]`: install an agent."""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from caldera.agents.blueprint import Refused, install
from caldera.cli import add_json_flag
from caldera.errors import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("blueprint", metavar="BLUEPRINT", help="a directory or .tar.gz with caldera.agent.yaml")
    parser.add_argument("--name", metavar="NAME", help="the agent's name (default: the manifest's name)")
    parser.add_argument("--user", metavar="ACCOUNT",
                        help="the account that runs an agent living in its home (its checkout, manifest and "
                             "workdir are that account's, in its home); without it the agent is installed "
                             "into its bundle and runs as caldera")
    parser.add_argument("--owner", metavar="USER",
                        help="a container image's user, who runs caldera itself: the agent's files become "
                             "USER's (agent.env root:USER's group 0640, secrets.env USER 0600)")
    add_json_flag(parser)


def main(args: argparse.Namespace) -> int:
    try:
        result = install(args.blueprint, name=args.name, user=args.user, image_user=args.owner)
    except Refused as exc:
        return _emit(args, {"ok": False, "message": str(exc), "held": []}, EXIT_FAILED)
    return _emit(args, {"ok": True, "held": [], **result}, EXIT_OK)


def _emit(args: argparse.Namespace, payload: dict[str, Any], code: int) -> int:
    if args.json:
        print(json.dumps(payload))
    else:
        print(payload["message"], file=sys.stdout if payload["ok"] else sys.stderr)
    return code
