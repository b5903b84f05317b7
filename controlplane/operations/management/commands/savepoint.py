from typing import Any

from django.core.management.base import CommandParser

from controlplane.operations.cli import OperationCommand


class Command(OperationCommand):
    help = "Tag a commit of a job's branch (the head, --snapshot, or the next epoch)."
    kind = "savepoint"

    def add_params(self, parser: CommandParser) -> None:
        parser.add_argument("--name", help="tag name (default savepoint-<branch>-e<epoch>-<id>)")
        parser.add_argument("--snapshot", help="snapshot to tag (default: the head)")
        parser.add_argument("--force-epoch", action="store_true", help="wait for a new epoch")

    def params(self, options: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {"force_epoch": options["force_epoch"]}
        for key in ("name", "snapshot"):
            if options[key]:
                params[key] = options[key]
        return params
