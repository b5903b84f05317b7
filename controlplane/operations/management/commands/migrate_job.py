from typing import Any

from django.core.management.base import CommandParser

from controlplane.operations.cli import OperationCommand


class Command(OperationCommand):
    help = (
        "Migrate a job: copy its application's lineage to another store (--store-url), apply a "
        "state-migration function (--function module:attr) or change M (--max-parallelism)."
    )
    kind = "migrate"

    def add_params(self, parser: CommandParser) -> None:
        what = parser.add_mutually_exclusive_group(required=True)
        what.add_argument("--store-url")
        what.add_argument("--function")
        what.add_argument("--max-parallelism", type=int)

    def params(self, options: dict[str, Any]) -> dict[str, Any]:
        if options["store_url"]:
            return {"mode": "copy", "store_url": options["store_url"]}
        if options["function"]:
            return {"mode": "transform", "function": options["function"]}
        return {"mode": "rehash", "max_parallelism": options["max_parallelism"]}
