"""`manage.py token USERNAME [--rotate]`: print the user's API token (created on first use)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.accounts.selectors import user_get
from controlplane.accounts.services import user_token
from controlplane.errors import EpochalError


class Command(BaseCommand):
    help = "Print USERNAME's API token (send it as `Authorization: Token <token>`)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--rotate", action="store_true", help="replace the token")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user = user_get(username=options["username"])
        except EpochalError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(user_token(user=user, rotate=options["rotate"]))
