"""The reconciler (Celery beat, every few seconds): make the world match the database.

* operations: dispatch pending ones the broker never delivered, and re-dispatch running ones
  whose worker died (lease expired) — the next worker resumes them at the unfinished phase;
* jobs: follow each live run through its launcher; restart a job whose run failed from its
  branch head (a start operation) — the first restart at once, later ones with exponential
  back-off — up to its `max_restarts`; a run that stays up `EPOCHAL_RESTART_RESET_AFTER_S`
  gives the job its whole restart budget back (a crash a month is not a crash loop).
  `watch_runs` does only this part, on its own short beat (`EPOCHAL_RUN_WATCH_INTERVAL_S`,
  1 s), so a dead driver is noticed within about a second;
* periodic savepoints: request the due ones, prune the oldest beyond retention
  (`controlplane.operations.schedule`);
* lineage: index commits the index has not seen yet (jobs commit without asking us);
* retention (hourly, `collect_garbage_all`): gc every application's store and clean up the
  leftovers of runs that ended long ago.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from controlplane.applications.models import Application
from controlplane.jobs.models import DesiredState, Job, JobState, Run, RunPhase
from controlplane.jobs.services import job_set_state, launcher_for, run_refresh, watch_record
from controlplane.jobs.store import application_repository
from controlplane.operations.executor import QUEUED
from controlplane.operations.models import ACTIVE_STATES, Operation
from controlplane.operations.schedule import prune_periodic_savepoints, request_due_savepoints
from controlplane.operations.services import (
    broker_unavailable,
    operation_enqueue,
    operation_request,
)
from runners.launcher import RunHandle
from snapshots_store import collect_garbage

log = logging.getLogger(__name__)


def _lease() -> dt.timedelta:
    return dt.timedelta(seconds=float(settings.EPOCHAL_OPERATION_LEASE_S))


def reconcile_operations() -> int:
    """(Re-)dispatch operations no worker holds; the number dispatched."""
    now = timezone.now()
    stale = Operation.objects.filter(state__in=ACTIVE_STATES).filter(
        Q(lease_expires_at__isnull=True, created_at__lt=now - dt.timedelta(seconds=2))
        | Q(lease_expires_at__lt=now)
    )
    stale = list(stale)
    dispatched = 0
    for op in stale:
        claimed = (
            Operation.objects.filter(pk=op.pk, lease_expires_at=op.lease_expires_at)
            .filter(state__in=ACTIVE_STATES)
            .update(lease_owner=QUEUED, lease_expires_at=now + _lease())
        )
        if not claimed:
            continue
        try:
            operation_enqueue(str(op.pk))
        except Exception as exc:
            # the broker is away: give the claim back, so the next tick (the beat's first
            # once the broker is back) dispatches it again rather than after a whole lease
            Operation.objects.filter(pk=op.pk, lease_owner=QUEUED, state__in=ACTIVE_STATES).update(
                lease_owner=op.lease_owner, lease_expires_at=op.lease_expires_at
            )
            waiting = len(stale) - dispatched
            log.warning(
                "%s; %d operation(s) wait for it, the next pass dispatches them",
                broker_unavailable(exc),
                waiting,
            )
            break  # the next one would meet the same broker
        dispatched += 1
        log.info("reconciler dispatched %s operation %s (%s)", op.kind, op.pk, op.state)
    return dispatched


def _backoff(job: Job) -> dt.timedelta:
    """The wait before the job's next restart: none for the first (a driver killed once —
    OOM, a lost node — should cost only the restart itself), then `restart_backoff_s`,
    doubling with every further restart, at most an hour."""
    if job.restarts == 0:
        return dt.timedelta(0)
    return dt.timedelta(seconds=min(3600, job.restart_backoff_s * 2 ** (job.restarts - 1)))


def _restart_reset_after() -> dt.timedelta:
    return dt.timedelta(seconds=float(settings.EPOCHAL_RESTART_RESET_AFTER_S))


def _forgive_restarts(now: dt.datetime) -> int:
    """Give the restart budget back to jobs whose current run has been up for
    `EPOCHAL_RESTART_RESET_AFTER_S` (Flink's reset-backoff-threshold, Kubernetes' back-off
    reset after a container runs fine): the next failure is a first one again — restarted at
    once, with the whole `max_restarts` ahead. The number of jobs reset."""
    stable = Run.objects.filter(
        phase=RunPhase.RUNNING, started_at__lte=now - _restart_reset_after()
    ).values("job_id")
    return Job.objects.filter(restarts__gt=0, pk__in=stable).update(
        restarts=0, next_restart_at=None
    )


def reconcile_jobs() -> tuple[int, int]:
    """Follow live runs; apply restart policies. (runs checked, restarts requested)."""
    checked = restarts = 0
    for run in Run.objects.filter(phase__in=[RunPhase.PENDING, RunPhase.RUNNING]).select_related(
        "job", "job__application"
    ):
        checked += 1
        try:
            run_refresh(run)
        except Exception:
            log.warning("status of run %s unavailable", run.run_id, exc_info=True)
    now = timezone.now()
    watch_record(now)
    _forgive_restarts(now)
    for job in Job.objects.filter(desired_state=DesiredState.RUNNING).select_related("application"):
        if Operation.objects.filter(job=job, state__in=ACTIVE_STATES).exists():
            continue
        if job.runs.filter(phase__in=[RunPhase.PENDING, RunPhase.RUNNING]).exists():
            continue
        last = job.runs.order_by("-created_at").first()
        if last is None:
            continue
        if last.phase == RunPhase.SUCCEEDED:
            job_set_state(
                job,
                JobState.STOPPED,
                reason=f"the run ended: {last.reason or 'the job returned'}",
                desired_state=DesiredState.STOPPED,
            )
            continue
        if last.phase == RunPhase.STOPPED:
            restarts += _start_again(job, last, now)
            continue
        if last.phase != RunPhase.FAILED:
            continue
        if job.restarts >= job.max_restarts:
            job_set_state(
                job,
                JobState.FAILED,
                reason=f"run {last.run_id} failed ({last.reason}); gave up after "
                f"{job.restarts} restarts — fix the cause and start the job",
                desired_state=DesiredState.STOPPED,
            )
            continue
        if job.next_restart_at is None:
            wait = _backoff(job)
            job_set_state(
                job,
                JobState.FAILED,
                reason=f"run {last.run_id} failed ({last.reason}); restarting from the head "
                f"in {wait.total_seconds():.0f} s",
                next_restart_at=now + wait,
            )
            if wait:
                continue  # a later tick restarts it; without a wait, this one does
        if job.next_restart_at is None or job.next_restart_at > now:
            continue
        # Claim the restart first (two reconcilers may run at once: the watch and the full tick)
        claimed = Job.objects.filter(
            pk=job.pk, restarts=job.restarts, next_restart_at=job.next_restart_at
        ).update(restarts=job.restarts + 1, next_restart_at=None)
        if not claimed:
            continue
        try:
            operation_request(
                kind="start",
                application=job.application,
                job=job,
                params={},
                via="reconciler",
                reason=f"restart policy: run {last.run_id} failed ({last.reason})",
            )
        except Exception as exc:
            log.warning("restart of job %s not requested: %s", job.name, exc)
            Job.objects.filter(pk=job.pk, restarts=job.restarts + 1).update(
                restarts=job.restarts, next_restart_at=job.next_restart_at
            )
            continue
        restarts += 1
    return checked, restarts


def _start_again(job: Job, last: Run, now: dt.datetime) -> int:
    """`job` should run, but its last run was stopped without the control plane asking for
    it (the control plane's own shutdown, a signal from outside): start it again from its
    head at once — not a failure, so no back-off and no restart counted. Claimed on the run,
    so it is asked for once however many reconcilers run. 1 when requested."""
    claimed = Run.objects.filter(pk=last.pk, restart_requested_at__isnull=True).update(
        restart_requested_at=now
    )
    if not claimed:
        return 0
    # what is true until the start operation launches a run (it refuses a "running" job)
    job_set_state(job, JobState.STOPPED, reason=last.reason or "stopped")
    try:
        operation_request(
            kind="start",
            application=job.application,
            job=job,
            params={},
            via="reconciler",
            reason=f"run {last.run_id} was {last.reason or 'stopped'}; the job should be "
            "running: starting it again from its head",
        )
    except Exception as exc:
        log.warning("start of job %s after %s not requested: %s", job.name, last.reason, exc)
        Run.objects.filter(pk=last.pk).update(restart_requested_at=None)
        return 0
    return 1


def reindex_all() -> int:
    """Index new commits of every application; the number of snapshots added."""
    from controlplane.lineage.services import reindex_application

    added = 0
    for application in Application.objects.all():
        try:
            result = reindex_application(
                application=application, repo=application_repository(application)
            )
            added += result.snapshots_added
        except Exception:
            log.warning("reindex of %s failed", application.name, exc_info=True)
    return added


def watch_runs() -> dict[str, int]:
    """The short beat: follow live runs and restart failed jobs, nothing else."""
    checked, restarts = reconcile_jobs()
    return {"runs_checked": checked, "restarts_requested": restarts}


def reconcile_all() -> dict[str, int]:
    dispatched = reconcile_operations()
    checked, restarts = reconcile_jobs()
    savepoints = request_due_savepoints(timezone.now())
    pruned = prune_periodic_savepoints()
    indexed = reindex_all()
    return {
        "operations_dispatched": dispatched,
        "runs_checked": checked,
        "restarts_requested": restarts,
        "savepoints_requested": savepoints,
        "savepoints_pruned": pruned,
        "snapshots_indexed": indexed,
    }


def collect_garbage_all() -> dict[str, int]:
    """Apply retention to every application's store; clean up long-finished runs."""
    retention = dt.timedelta(days=float(settings.EPOCHAL_GC_RETENTION_DAYS))
    removed = 0
    for application in Application.objects.all():
        try:
            report = collect_garbage(application_repository(application), retention=retention)
            removed += len(report.removed)
        except Exception:
            log.warning("gc of %s failed", application.name, exc_info=True)
    cleaned = 0
    old = timezone.now() - retention
    for run in Run.objects.filter(finished_at__lt=old).exclude(handle=None):
        try:
            launcher_for(run.runner).cleanup(RunHandle.from_dict(run.handle))
            cleaned += 1
        except Exception:
            log.warning("cleanup of run %s failed", run.run_id, exc_info=True)
    return {"objects_removed": removed, "runs_cleaned": cleaned}
