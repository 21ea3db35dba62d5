"""`caldera init BLUEPRINT [--name NAME] [--user ACCOUNT | --owner USER]`: install an agent."""
from __future__ import annotations

import json
import os
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
        result = install(args.blueprint, name=args.name, user=args.user, image_user=args.owner, program=program())
    except Refused as exc:
        return _emit(args, {"ok": False, "message": str(exc), "held": []}, EXIT_FAILED)
    return _emit(args, {"ok": True, "held": [], **result}, EXIT_OK)


def program(argv0: str | None = None) -> str:
    """How the person calls caldera from here, for the printed next step: `caldera` when the
    PATH finds this very program (or it was started otherwise: `python3 -m caldera.cli`),
    else the console script's absolute path (a virtualenv's, not activated)."""
    import shlex
    import shutil

    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) != "caldera":
        return "caldera"
    found = shutil.which("caldera")
    try:
        if found and os.path.samefile(found, argv0):
            return "caldera"
    except OSError:
        pass
    return shlex.quote(os.path.abspath(argv0))


def _emit(args: argparse.Namespace, payload: dict[str, Any], code: int) -> int:
    if args.json:
        print(json.dumps(payload))
    else:
        print(payload["message"], file=sys.stdout if payload["ok"] else sys.stderr)
    return code
