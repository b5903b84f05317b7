from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from controlplane.jobs.selectors import job_list
from controlplane.jobs.store import branch_head
from controlplane.operations.selectors import operation_active_for_job


class Command(BaseCommand):
    help = "List jobs: state, branch, parallelism, head snapshot and running operation."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--application")
        parser.add_argument("--state")

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(
            f"{'JOB':<24} {'APPLICATION':<16} {'BRANCH':<16} {'STATE':<9} {'P':>3}  "
            f"{'HEAD':<13} OPERATION"
        )
        for job in job_list(application=options["application"], state=options["state"]):
            try:
                head = branch_head(job) or "-"
            except Exception as exc:  # the store may be unreachable: say so, keep listing
                head = f"(store error: {exc})"
            op = operation_active_for_job(job_id=job.pk)
            running = f"{op.kind} {op.state} {op.current_phase}" if op else ""
            self.stdout.write(
                f"{job.name:<24} {job.application.name:<16} {job.branch:<16} {job.state:<9} "
                f"{job.parallelism:>3}  {head[:12]:<13} {running}"
            )
            if job.status_reason:
                self.stdout.write(f"{'':<24} {job.status_reason}")
