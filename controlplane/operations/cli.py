"""What the operation commands (`manage.py rescale …`) share: request, then follow to the end.

By default a command records the operation and a Celery worker executes it; the command prints
each phase as it progresses and exits 0 when the operation succeeded, 1 otherwise. `--inline`
executes the operation in the command's own process (no worker needed), `--no-wait` returns
right after the request.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.audit.services import audit_request
from controlplane.errors import EpochalError
from controlplane.jobs.models import Job
from controlplane.jobs.selectors import job_get
from controlplane.operations.executor import execute
from controlplane.operations.models import TERMINAL_STATES, Operation
from controlplane.operations.services import operation_request


class OperationCommand(BaseCommand):
    """Subclasses set `kind` and implement `add_params` / `params`."""

    kind = ""
    needs_job = True

    def add_arguments(self, parser: CommandParser) -> None:
        if self.needs_job:
            parser.add_argument("job", help="job name (see `manage.py jobs`)")
        self.add_params(parser)
        parser.add_argument("--reason", default="", help="why (recorded in the audit log)")
        parser.add_argument("--as", dest="as_user", help="requesting user (default: none)")
        parser.add_argument("--idempotency-key", default="", help="repeat-safe request key")
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--inline", action="store_true", help="execute here instead of in a Celery worker"
        )
        mode.add_argument("--no-wait", action="store_true", help="print the id and return")
        parser.add_argument(
            "--timeout", type=float, default=1800, help="seconds to follow the operation"
        )

    def add_params(self, parser: CommandParser) -> None:
        """Kind-specific arguments."""

    def params(self, options: dict[str, Any]) -> dict[str, Any]:
        return {}

    def target(self, options: dict[str, Any]) -> tuple[Any, Job | None]:
        job = job_get(name=options["job"])
        return job.application, job

    def handle(self, *args: Any, **options: Any) -> None:
        user = None
        if options["as_user"]:
            user = get_user_model().objects.filter(username=options["as_user"]).first()
            if user is None:
                raise CommandError(f"no user {options['as_user']!r}")
        try:
            application, job = self.target(options)
            requested = operation_request(
                kind=self.kind,
                application=application,
                job=job,
                params=self.params(options),
                user=user,
                idempotency_key=options["idempotency_key"],
                reason=options["reason"],
                via="cli",
                dispatch=not options["inline"],
            )
        except EpochalError as exc:
            audit_request(
                user=user,
                action=f"cli {self.kind}",
                source="cli",
                outcome="refused",
                detail=exc.to_dict(),
            )
            raise CommandError(exc.message) from None
        op = requested.operation
        audit_request(
            user=user,
            action=f"cli {self.kind}",
            target=str(op.pk),
            source="cli",
            outcome="accepted" if requested.created else "repeated",
            operation=op,
        )
        word = "requested" if requested.created else "already requested (same idempotency key)"
        self.stdout.write(f"{self.kind} operation {op.pk} {word}")
        if options["no_wait"]:
            return
        if options["inline"]:
            execute(op.pk)
        final = follow(op, self.stdout.write, timeout_s=options["timeout"])
        if final.state != "succeeded":
            raise CommandError(
                f"{self.kind} {final.state}: {final.error_message or final.error_code}"
            )


def follow(op: Operation, write: Any, *, timeout_s: float, interval_s: float = 0.5) -> Operation:
    """Print phase changes of `op` until it ends (or `timeout_s` passes)."""
    seen: dict[str, tuple[str, str]] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        op.refresh_from_db()
        for record in op.phases:
            key = (record["state"], record.get("detail") or "")
            if seen.get(record["name"]) != key:
                seen[record["name"]] = key
                detail = f" — {key[1]}" if key[1] else ""
                write(f"  [{op.progress * 100:5.1f}%] {record['name']}: {key[0]}{detail}")
        if op.state in TERMINAL_STATES:
            break
        if time.monotonic() > deadline:
            write(
                f"still {op.state} after {timeout_s:g} s; follow with `manage.py operation {op.pk}`"
            )
            return op
        if (
            op.state == "pending"
            and time.monotonic() > deadline - timeout_s + 15
            and not seen.get("_w")
        ):
            seen["_w"] = ("", "")
            sys.stderr.write("  (still pending: is a Celery worker running? or use --inline)\n")
        time.sleep(interval_s)
    result = json.dumps(op.result, sort_keys=True) if op.result else ""
    write(f"{op.kind} {op.state}" + (f": {result}" if result else ""))
    return op
