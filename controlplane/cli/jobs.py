"""Job verbs: `epochal jobs`, `epochal register`, `epochal log`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.db import transaction

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.cli.console import CliError, Console
from controlplane.cli.verb import Verb
from controlplane.jobs.models import Job
from controlplane.jobs.selectors import job_get, job_list, job_shown_state, runs_watched_at
from controlplane.jobs.services import (
    job_create,
    job_set_savepoint_schedule,
    version_config_errors,
)
from controlplane.jobs.store import application_repository, branch_head
from controlplane.operations.selectors import operation_active_for_job
from runners import entry_points
from runners.launchers import RUNNERS


def _jobs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--application", help="only this application's jobs")
    parser.add_argument("--state", help="only jobs in this state (running, stopped, failed …)")


def _run_jobs(args: argparse.Namespace, console: Console) -> int:
    rows: list[dict[str, Any]] = []
    watched_at = runs_watched_at()
    for job in job_list(application=args.application, state=args.state):
        shown = job_shown_state(job, watched_at=watched_at)
        try:
            head = branch_head(job) or ""
        except Exception as exc:  # the store may be unreachable: say so, keep listing
            head = f"(store error: {exc})"
        op = operation_active_for_job(job_id=job.pk)
        rows.append(
            {
                "name": job.name,
                "application": job.application.name,
                "branch": job.branch,
                # what is known: `unknown` while nothing watches a run the database calls
                # running (the control plane is down); the recorded state beside it
                "state": shown.state,
                "recorded_state": job.state,
                "desired_state": job.desired_state,
                "runs_watched_at": watched_at.isoformat() if watched_at else None,
                "parallelism": job.parallelism,
                "head": head,
                "operation": {
                    "id": str(op.pk),
                    "kind": op.kind,
                    "state": op.state,
                    "phase": op.current_phase,
                }
                if op
                else None,
                "status_reason": shown.reason,
            }
        )
    if console.as_json:
        console.json(rows)
        return 0
    console.table(
        ["JOB", "APPLICATION", "BRANCH", "STATE", "P", "HEAD", "OPERATION"],
        [
            [
                r["name"],
                r["application"],
                r["branch"],
                r["state"] + (f" ({r['status_reason']})" if r["status_reason"] else ""),
                r["parallelism"],
                r["head"][:12] or "-",
                " ".join(r["operation"][k] for k in ("kind", "state", "phase"))
                if r["operation"]
                else "",
            ]
            for r in rows
        ],
    )
    return 0


JOBS = Verb(
    "jobs",
    "list jobs: state, branch, parallelism, head snapshot, running operation",
    _jobs_arguments,
    _run_jobs,
)


def _register_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("application")
    parser.add_argument(
        "--job",
        required=True,
        help="entry-point name of the job (group epochal.jobs; `epochal entry-points` lists them)",
    )
    parser.add_argument("--job-args", default="{}", help="JSON keyword arguments of the job")
    parser.add_argument("--config", default="{}", help="JSON launcher config of the version")
    parser.add_argument("--code-version", default="1")
    parser.add_argument("--job-name", help="default <application>-<branch>")
    parser.add_argument("--branch", default="main")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--max-parallelism", type=int, default=128)
    parser.add_argument("--runner", default="", choices=["", *RUNNERS])


def _run_register(args: argparse.Namespace, console: Console) -> int:
    try:
        job_args = json.loads(args.job_args)
        config = json.loads(args.config)
    except ValueError as exc:
        raise CliError(f"--job-args / --config must be JSON: {exc}") from None
    if not isinstance(job_args, dict) or not isinstance(config, dict):
        raise CliError("--job-args and --config must be JSON objects")
    if job_args:
        config = {**config, "job_args": job_args}
    errors = version_config_errors(config)
    if errors:
        raise CliError(f"invalid config: {errors}")
    unusable = entry_points.lookup_error(entry_points.JOBS, args.job)
    if unusable:
        raise CliError(f"--job: {unusable}")
    name = args.job_name or f"{args.application}-{args.branch}".replace("/", "-")
    with transaction.atomic():
        application, created = Application.objects.get_or_create(
            name=args.application,
            defaults={"store_namespace": args.application, "max_parallelism": args.max_parallelism},
        )
        version = ApplicationVersion.objects.filter(
            application=application,
            job=args.job,
            config=config,
            code_version=args.code_version,
        ).first()
        if version is None:
            version = ApplicationVersion.objects.create(
                application=application,
                number=application.versions.count() + 1,
                job=args.job,
                config=config,
                code_version=args.code_version,
                reason="registered from the command line",
            )
        job = Job.objects.filter(name=name).first()
        if job is None:
            job = job_create(
                name=name,
                application=application,
                version=version,
                branch=args.branch,
                parallelism=args.parallelism,
                runner=args.runner,
            )
        elif job.version_id != version.pk:
            Job.objects.filter(pk=job.pk).update(version=version)
    summary = {
        "application": application.name,
        "application_created": created,
        "version": version.number,
        "job": name,
        "branch": job.branch,
    }
    if console.as_json:
        console.json(summary)
    else:
        console.line(
            f"application {application.name} ({'created' if created else 'exists'}), "
            f"version {version.number}, job {name} on branch {job.branch}"
        )
    return 0


REGISTER = Verb(
    "register",
    "register a streaming job: application (created when new), version, job for a branch",
    _register_arguments,
    _run_register,
)


def only_application(name: str | None) -> Application:
    """The application named `name`, or the only one there is."""
    apps = Application.objects.order_by("name")
    if name:
        apps = apps.filter(name=name)
    if apps.count() != 1:
        names = [a.name for a in Application.objects.order_by("name")]
        if name:
            raise CliError(f"no application {name!r}; the applications are {names}")
        raise CliError(f"name the application with --application (one of {names})")
    return apps.get()


def _log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("branch", help="branch name, or a revision (tag, id, rev~n)")
    parser.add_argument("--application", help="default: the only application")
    parser.add_argument("--limit", "-n", type=int, default=20, help="at most N snapshots")
    parser.add_argument("--full", action="store_true", help="all parents, not first only")


def _run_log(args: argparse.Namespace, console: Console) -> int:
    repo = application_repository(only_application(args.application))
    entries = list(repo.log(args.branch, first_parent=not args.full, limit=args.limit))
    if console.as_json:
        console.json([{"id": sid, **manifest.to_dict()} for sid, manifest in entries])
        return 0
    rows = []
    for sid, manifest in entries:
        provenance = ", ".join(
            f"{k}={v[:16]}" for k, v in sorted(dict(manifest.provenance).items()) if v
        )
        rows.append(
            [
                sid[:12],
                manifest.created_at[:19],
                manifest.kind,
                manifest.epoch,
                manifest.parallelism,
                provenance,
            ]
        )
    console.table(["SNAPSHOT", "CREATED", "KIND", "EPOCH", "P", "PROVENANCE"], rows)
    return 0


LOG = Verb(
    "log",
    "a branch's history (first-parent by default), newest first, with provenance",
    _log_arguments,
    _run_log,
)


def _savepoints_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job")
    parser.add_argument(
        "--every", type=int, help="take a savepoint of the running job every N seconds (0: off)"
    )
    parser.add_argument("--keep", type=int, help="keep the newest N periodic savepoints (0: all)")


def _run_savepoints(args: argparse.Namespace, console: Console) -> int:
    from controlplane.operations.schedule import periodic_tags, schedule_data

    job = job_get(name=args.job)
    if args.every is not None or args.keep is not None:
        job = job_set_savepoint_schedule(
            job,
            interval_s=job.savepoint_interval_s if args.every is None else args.every,
            retention=job.savepoint_retention if args.keep is None else args.keep,
        )
    if console.as_json:
        console.json(schedule_data(job))
        return 0
    tags = periodic_tags(job)
    if job.savepoint_interval_s:
        keep = f"the newest {job.savepoint_retention}" if job.savepoint_retention else "all"
        console.line(
            f"{job.name}: a savepoint every {job.savepoint_interval_s} s while it runs, "
            f"keeping {keep}"
        )
    else:
        console.line(f"{job.name}: no periodic savepoints (--every SECONDS turns them on)")
    console.table(["TAG", "SNAPSHOT"], [[name, sid[:12]] for name, sid in tags])
    return 0


SAVEPOINTS = Verb(
    "savepoints",
    "a job's periodic savepoints: --every SECONDS, --keep N, and the ones kept",
    _savepoints_arguments,
    _run_savepoints,
)

VERBS = (JOBS, REGISTER, LOG, SAVEPOINTS)
