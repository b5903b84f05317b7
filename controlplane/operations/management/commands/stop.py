from typing import Any

from django.core.management.base import CommandParser

from controlplane.operations.cli import OperationCommand


class Command(OperationCommand):
    help = "Stop a job at its next epoch boundary (forced after --deadline seconds)."
    kind = "stop"

    def add_params(self, parser: CommandParser) -> None:
        parser.add_argument("--deadline", type=float, default=None, help="seconds (default 60)")

    def params(self, options: dict[str, Any]) -> dict[str, Any]:
        return {} if options["deadline"] is None else {"stop_deadline_s": options["deadline"]}
