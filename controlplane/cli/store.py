"""`epochal store …`: the snapshot store's commands (`python -m snapshots_store`) on a registered
application's store and namespace — the only application by default, else `--application`;
`--store URL --namespace NS` names any store (the URL defaults to the configured `STORE_URL`)."""

from __future__ import annotations

import argparse

from django.conf import settings

from controlplane.applications.models import Application
from controlplane.cli.console import CliError, Console
from controlplane.cli.jobs import only_application
from controlplane.cli.verb import Verb
from controlplane.jobs.store import application_repository
from snapshots_store import Repository
from snapshots_store.cli import add_commands, json_flag, run_command


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--application", help="whose store (default: the only application)")
    parser.add_argument(
        "--store", help="a store URL instead (default with --namespace: the configured STORE_URL)"
    )
    parser.add_argument("--namespace", help="the namespace in --store (an application's name)")
    parser.epilog = "Exit status: 0 ok, 1 store error, 2 bad usage, 3 fsck found problems."
    add_commands(
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND"), [json_flag()]
    )


def _repository(args: argparse.Namespace) -> Repository:
    if args.store or args.namespace:
        if not args.namespace:
            raise CliError("--store needs --namespace (an application's store namespace)")
        return Repository.open(args.store or settings.EPOCHAL_STORE_URL, args.namespace)
    if not Application.objects.exists():
        raise CliError(
            "no application is registered: name a store with --namespace NS [--store URL]"
        )
    return application_repository(only_application(args.application))


def _run(args: argparse.Namespace, console: Console) -> int:
    args.json = console.as_json
    return run_command(_repository(args), args, console.stdout)


STORE = Verb(
    "store",
    "inspect and maintain the snapshot store: log, show, diff, refs, reflog, resolve, gc, fsck",
    _arguments,
    _run,
    json=False,  # each store command takes --json itself
)
