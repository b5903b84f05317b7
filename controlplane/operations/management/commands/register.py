import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.errors import EpochalError
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create, version_config_errors


class Command(BaseCommand):
    help = (
        "Register a streaming job: its application (created when new), a version with the code "
        "reference and config, and a job for a branch. Idempotent for an unchanged definition."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("application")
        parser.add_argument(
            "--job-ref", required=True, help="module:attr, e.g. runners.jobs.fraud:job"
        )
        parser.add_argument("--job-args", default="{}", help="JSON keyword arguments of the job")
        parser.add_argument("--config", default="{}", help="JSON launcher config of the version")
        parser.add_argument("--code-version", default="1")
        parser.add_argument("--job-name", help="default <application>-<branch>")
        parser.add_argument("--branch", default="main")
        parser.add_argument("--parallelism", type=int, default=2)
        parser.add_argument("--max-parallelism", type=int, default=128)
        parser.add_argument("--runner", default="", choices=["", "local", "kubernetes"])

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            job_args = json.loads(options["job_args"])
            config = json.loads(options["config"])
        except ValueError as exc:
            raise CommandError(f"--job-args / --config must be JSON: {exc}") from None
        if not isinstance(job_args, dict) or not isinstance(config, dict):
            raise CommandError("--job-args and --config must be JSON objects")
        if job_args:
            config = {**config, "job_args": job_args}
        errors = version_config_errors(config)
        if errors:
            raise CommandError(f"invalid config: {errors}")
        name = options["job_name"] or f"{options['application']}-{options['branch']}".replace(
            "/", "-"
        )
        with transaction.atomic():
            application, created = Application.objects.get_or_create(
                name=options["application"],
                defaults={
                    "store_namespace": options["application"],
                    "max_parallelism": options["max_parallelism"],
                },
            )
            version = ApplicationVersion.objects.filter(
                application=application,
                job=options["job_ref"],
                config=config,
                code_version=options["code_version"],
            ).first()
            if version is None:
                number = application.versions.count() + 1
                version = ApplicationVersion.objects.create(
                    application=application,
                    number=number,
                    job=options["job_ref"],
                    config=config,
                    code_version=options["code_version"],
                    reason="registered from the command line",
                )
            job = Job.objects.filter(name=name).first()
            if job is None:
                try:
                    job = job_create(
                        name=name,
                        application=application,
                        version=version,
                        branch=options["branch"],
                        parallelism=options["parallelism"],
                        runner=options["runner"],
                    )
                except EpochalError as exc:
                    raise CommandError(f"{exc.message} {exc.fields or ''}") from None
            elif job.version_id != version.pk:
                Job.objects.filter(pk=job.pk).update(version=version)
        self.stdout.write(
            f"application {application.name} ({'created' if created else 'exists'}), "
            f"version {version.number}, job {name} on branch {job.branch}"
        )
