import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from controlplane.applications.selectors import application_get
from controlplane.jobs.selectors import job_get
from controlplane.operations.cli import OperationCommand


class Command(OperationCommand):
    help = "Fork a new branch, application version and job from any snapshot."
    kind = "fork"
    needs_job = False

    def add_params(self, parser: CommandParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--job", dest="source_job", help="fork from this job's lineage")
        source.add_argument("--application", help="fork within this application")
        parser.add_argument("--snapshot", required=True, help="snapshot id, prefix, tag, rev~n")
        parser.add_argument("--branch", required=True, help="the new branch")
        parser.add_argument("--job-name", help="the new job (default <application>-<branch>)")
        parser.add_argument("--job-ref", help="module:attr of the new version's job")
        parser.add_argument("--code-version")
        parser.add_argument("--config", help="JSON config of the new version")
        parser.add_argument("--parallelism", type=int)
        parser.add_argument("--start", action="store_true", help="start the new job")

    def target(self, options: dict[str, Any]) -> tuple[Any, Any]:
        if options["source_job"]:
            job = job_get(name=options["source_job"])
            return job.application, job
        return application_get(name=options["application"]), None

    def params(self, options: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {
            "snapshot": options["snapshot"],
            "branch": options["branch"],
            "start": options["start"],
        }
        for key, name in (
            ("job_name", "job_name"),
            ("job_ref", "job"),
            ("code_version", "code_version"),
            ("parallelism", "parallelism"),
        ):
            if options[key] is not None:
                params[name] = options[key]
        if options["config"]:
            try:
                params["config"] = json.loads(options["config"])
            except ValueError as exc:
                raise CommandError(f"--config is not JSON: {exc}") from None
        return params
