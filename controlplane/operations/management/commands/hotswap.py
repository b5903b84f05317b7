from typing import Any

from django.core.management.base import CommandParser

from controlplane.operations.cli import OperationCommand


class Command(OperationCommand):
    help = "Swap a running job for a new version (a fork of its branch) at a swap epoch S."
    kind = "hotswap"

    def add_params(self, parser: CommandParser) -> None:
        parser.add_argument("--new-job", required=True, help="the new version's job (a fork)")
        parser.add_argument("--swap-epoch", type=int, default=None, help="S (default: soon)")
        parser.add_argument("--lead-epochs", type=int, default=3, help="S = now + this")

    def params(self, options: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {
            "new_job": options["new_job"],
            "lead_epochs": options["lead_epochs"],
        }
        if options["swap_epoch"] is not None:
            params["swap_epoch"] = options["swap_epoch"]
        return params
