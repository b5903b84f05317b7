from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.errors import EpochalError
from controlplane.operations.cli import follow
from controlplane.operations.selectors import operation_get, operation_list
from controlplane.operations.services import operation_cancel


class Command(BaseCommand):
    help = "Show (and follow) an operation, list recent ones, or cancel one."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("id", nargs="?", help="operation id (omit to list recent ones)")
        parser.add_argument("--cancel", action="store_true")
        parser.add_argument("--job", help="list: only this job's operations")
        parser.add_argument("--limit", type=int, default=20)

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["id"]:
            for op in operation_list(job=options["job"])[: options["limit"]]:
                target = op.job.name if op.job else op.application.name
                self.stdout.write(
                    f"{op.pk}  {op.created_at:%Y-%m-%d %H:%M:%S}  {op.kind:<9} {target:<24} "
                    f"{op.state:<9} {op.current_phase} {op.error_message[:60]}"
                )
            return
        try:
            op = operation_get(operation_id=options["id"])
            if options["cancel"]:
                op = operation_cancel(operation=op)
                self.stdout.write(f"cancel requested for {op.pk} ({op.state})")
        except EpochalError as exc:
            raise CommandError(exc.message) from None
        final = follow(op, self.stdout.write, timeout_s=3600)
        if final.state not in ("succeeded",):
            raise CommandError(f"{final.kind} {final.state}: {final.error_message}")
