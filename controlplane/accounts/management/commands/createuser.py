"""`manage.py createuser USERNAME --role ROLE [--password …] [--email …]`: a user with a role."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.accounts.roles import ROLES
from controlplane.accounts.services import user_create
from controlplane.errors import EpochalError


class Command(BaseCommand):
    help = "Create a user with a role (viewer, operator, admin); no password = token-only user."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=ROLES)
        parser.add_argument("--password", default=None, help="omit for a token-only user")
        parser.add_argument("--email", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user = user_create(
                username=options["username"],
                role=options["role"],
                password=options["password"],
                email=options["email"],
            )
        except EpochalError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"created {user.username} ({options['role']})")
