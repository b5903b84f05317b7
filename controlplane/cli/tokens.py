"""`epochal token USERNAME …`: issue, list, rotate and revoke a user's API tokens (audited as
done from the command line). A secret is printed once, when it is issued."""

from __future__ import annotations

import argparse

from controlplane.accounts import tokens
from controlplane.accounts.models import ApiToken
from controlplane.accounts.selectors import user_get
from controlplane.cli.console import CliError, Console
from controlplane.cli.verb import Verb


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("username")
    parser.add_argument("--name", default="", help="a label for a new token")
    parser.add_argument(
        "--expires-days", type=int, default=None, help="a new token stops working after this"
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="list the user's tokens")
    what.add_argument(
        "--rotate",
        nargs="?",
        const="*",
        metavar="PREFIX",
        help="revoke the token with PREFIX (default: all active ones) and issue its successor",
    )
    what.add_argument("--revoke", metavar="PREFIX", help="revoke the token with PREFIX")


def _one(user: object, prefix: str) -> ApiToken:
    matches = list(ApiToken.objects.filter(user=user, prefix__startswith=prefix[:12]))
    if len(matches) != 1:
        raise CliError(
            f"{len(matches)} tokens of this user start with {prefix!r}; list them with --list"
        )
    return matches[0]


def _run(args: argparse.Namespace, console: Console) -> int:
    user = user_get(username=args.username)
    if args.list:
        rows = ApiToken.objects.filter(user=user)
        if console.as_json:
            console.json(
                [
                    {
                        "id": t.pk,
                        "prefix": t.prefix,
                        "name": t.name,
                        "state": t.state,
                        "expires_at": t.expires_at and t.expires_at.isoformat(),
                        "last_used_at": t.last_used_at and t.last_used_at.isoformat(),
                    }
                    for t in rows
                ]
            )
        else:
            console.table(
                ["ID", "PREFIX", "NAME", "STATE", "EXPIRES", "LAST USED"],
                [
                    [
                        t.pk,
                        t.prefix,
                        t.name or "-",
                        t.state,
                        f"{t.expires_at:%Y-%m-%d}" if t.expires_at else "never",
                        f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never",
                    ]
                    for t in rows
                ],
            )
        return 0
    if args.revoke:
        token = tokens.token_revoke(token=_one(user, args.revoke), source="cli")
        console.line(f"revoked {token.prefix}…")
        return 0
    if args.rotate and args.rotate != "*":
        issued = tokens.token_rotate(token=_one(user, args.rotate), source="cli")
    else:
        if args.rotate == "*":
            for token in ApiToken.objects.filter(user=user, revoked_at__isnull=True):
                tokens.token_revoke(token=token, source="cli")
        issued = tokens.token_create(
            user=user, name=args.name, expires_in_days=args.expires_days, source="cli"
        )
    if console.as_json:
        console.json({"id": issued.token.pk, "prefix": issued.token.prefix, "token": issued.secret})
    else:
        console.line(issued.secret)  # alone on stdout: T=$(epochal token ana)
        console.stderr.write(f"token {issued.token.prefix}… issued; it is not shown again\n")
    return 0


TOKEN = Verb(
    "token",
    "issue, list, rotate or revoke a user's API tokens (a secret is shown once)",
    _arguments,
    _run,
)
