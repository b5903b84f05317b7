from typing import Any

from django.core.management.base import CommandParser

from controlplane.operations.cli import OperationCommand


class Command(OperationCommand):
    help = "Align a downstream job's epochs to its upstream job (catch up, align, or abort)."
    kind = "align"

    def add_params(self, parser: CommandParser) -> None:
        parser.add_argument("--upstream-job", required=True, help="the job whose output it reads")
        parser.add_argument("--source", default="upstream", help="its source name")
        parser.add_argument("--command", choices=["align", "catch_up", "abort"], default="align")
        parser.add_argument("--from-epoch", type=int, default=None, help="E (default: soon)")

    def params(self, options: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {
            "upstream_job": options["upstream_job"],
            "source": options["source"],
            "command": options["command"],
        }
        if options["from_epoch"] is not None:
            params["from_epoch"] = options["from_epoch"]
        return params
