from typing import Any

from django.core.management.base import CommandParser

from controlplane.operations.cli import OperationCommand


class Command(OperationCommand):
    help = "Start a job from its branch head (or an empty initial snapshot with --from-empty)."
    kind = "start"

    def add_params(self, parser: CommandParser) -> None:
        parser.add_argument("--from-empty", action="store_true")

    def params(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"from_empty": True} if options["from_empty"] else {}
