"""`manage.py rescale …` and friends: thin wrappers over the `epochal` verbs."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.cli.console import CliError, Console, refusal
from controlplane.cli.main import add_verb_arguments, verb_named
from controlplane.errors import EpochalError


def verb_command(name: str) -> type[BaseCommand]:
    """A management command running the `epochal` verb `name`."""
    verb = verb_named(name)

    class Command(BaseCommand):
        help = f"{verb.help} (the same as `epochal {verb.name}`)"

        def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
            # A verb's own option wins over Django's of the same name (`fork --version N` is
            # the version to run, not Django's version).
            return super().create_parser(
                prog_name, subcommand, conflict_handler="resolve", **kwargs
            )

        def add_arguments(self, parser: CommandParser) -> None:
            add_verb_arguments(verb, parser)

        def handle(self, *args: Any, **options: Any) -> None:
            console = Console(self.stdout, self.stderr, as_json=bool(options.get("json")))
            try:
                status = verb.run(argparse.Namespace(**options), console)
            except CliError as exc:
                raise CommandError(exc.message, returncode=exc.status) from None
            except EpochalError as exc:
                raise CommandError(refusal(exc)) from None
            if status:
                raise CommandError(f"{verb.name} exited with status {status}", returncode=status)

    return Command
