from typing import Any

from django.core.management.base import CommandParser

from controlplane.operations.cli import OperationCommand


class Command(OperationCommand):
    help = "Roll a job's branch back to an earlier snapshot and restart from it."
    kind = "rollback"

    def add_params(self, parser: CommandParser) -> None:
        parser.add_argument("--to", required=True, help="snapshot id, prefix, tag or rev~n")

    def params(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"to": options["to"]}
