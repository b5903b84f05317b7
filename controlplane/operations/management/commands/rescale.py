from typing import Any

from django.core.management.base import CommandParser

from controlplane.operations.cli import OperationCommand


class Command(OperationCommand):
    help = "Change a job's parallelism: live at the next epoch, or by a restart."
    kind = "rescale"

    def add_params(self, parser: CommandParser) -> None:
        parser.add_argument("--parallelism", "-p", type=int, required=True)
        parser.add_argument("--mode", choices=["auto", "live", "restart"], default="auto")

    def params(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"parallelism": options["parallelism"], "mode": options["mode"]}
