"""Reads for jobs and runs."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.errors import NotFound
from controlplane.jobs.models import Job, Run, RunPhase


def job_not_found(name: str) -> NotFound:
    return NotFound(
        f"no job named {name!r}; list jobs with `epochal jobs` or GET /api/jobs/",
        code="job_not_found",
    )


def job_get(*, name: str) -> Job:
    try:
        return Job.objects.select_related("application", "version").get(name=name)
    except Job.DoesNotExist:
        raise job_not_found(name) from None


def job_list(*, application: str | None = None, state: str | None = None) -> QuerySet[Job]:
    jobs = Job.objects.select_related("application", "version").order_by("name")
    if application:
        jobs = jobs.filter(application__name=application)
    if state:
        jobs = jobs.filter(state=state)
    return jobs


def job_live_runs(job: Job) -> list[Run]:
    """Runs the control plane believes are pending or running (normally at most one)."""
    return list(job.runs.filter(phase__in=[RunPhase.PENDING, RunPhase.RUNNING]))


def job_current_run(job: Job) -> Run | None:
    return job.runs.order_by("-created_at").first()


# -- added for the REST API -----------------------------------------------------------------


def job_run_list(job: Job) -> QuerySet[Run]:
    """The job's runs, newest first."""
    return job.runs.select_related("operation").order_by("-created_at", "-id")


def job_run_get(job: Job, *, run_id: str) -> Run:
    run = job.runs.filter(run_id=run_id).first()
    if run is None:
        raise NotFound(
            f"job {job.name} has no run {run_id!r}; list them with GET /api/jobs/{job.name}/runs/",
            code="run_not_found",
        )
    return run
