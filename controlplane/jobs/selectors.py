"""Reads for jobs and runs."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from controlplane.errors import NotFound
from controlplane.jobs.models import Job, JobState, Run, RunPhase, Watch

#: The name of the reconciler's run watch in `Watch`.
RUN_WATCH = "runs"
#: What a job the database calls running shows while nothing watches its runs.
UNKNOWN = "unknown"
CONTROL_PLANE_DOWN = "control plane was down"
#: States that are only true while someone watches the run.
WATCHED_STATES = frozenset({JobState.STARTING, JobState.RUNNING, JobState.STOPPING})


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


# -- is anyone watching? ----------------------------------------------------------------------


def unwatched_after_s() -> float:
    """A run nobody has watched for this long has an unknown state."""
    return float(getattr(settings, "EPOCHAL_UNWATCHED_AFTER_S", 30.0))


def runs_watched_at() -> dt.datetime | None:
    """When the reconciler last checked every live run (None: never)."""
    return Watch.objects.filter(name=RUN_WATCH).values_list("at", flat=True).first()


@dataclass(frozen=True)
class ShownState:
    """A job's state as the CLI and the dashboard show it: the recorded one, or `unknown`
    when the job should be running and nothing has watched its run for a while."""

    state: str
    reason: str
    watched_at: dt.datetime | None

    @property
    def text(self) -> str:
        return f"{self.state} ({self.reason})" if self.reason else self.state


def job_shown_state(
    job: Job, *, watched_at: dt.datetime | None, now: dt.datetime | None = None
) -> ShownState:
    """`job`'s state as far as anyone knows, given when its runs were last watched
    (`runs_watched_at`, read once for a whole list)."""
    if is_unwatched(str(job.state), watched_at, now=now):
        return ShownState(UNKNOWN, CONTROL_PLANE_DOWN, watched_at)
    return ShownState(str(job.state), job.status_reason, watched_at)


def is_unwatched(
    state: str, watched_at: dt.datetime | None, *, now: dt.datetime | None = None
) -> bool:
    """Whether a job in `state` should have a live run that nothing has watched lately."""
    if state not in WATCHED_STATES:
        return False
    now = now or timezone.now()
    stale = dt.timedelta(seconds=unwatched_after_s())
    return watched_at is None or now - watched_at > stale
