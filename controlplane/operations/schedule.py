"""Periodic savepoints: a job setting (`Job.savepoint_interval_s`, `savepoint_retention`) the
reconciler carries out, like the Flink Kubernetes Operator's `periodicSavepointInterval` and
savepoint history.

Every `savepoint_interval_s` the reconciler requests a savepoint operation of the running
job's head, tagged `periodic-BRANCH-YYYYMMDDTHHMMSSZ` (tags are gc roots: the state stays
restorable), and deletes the oldest periodic tags beyond `savepoint_retention` — only those:
savepoints people ask for are never removed. One active operation per job holds as for any
operation: a job busy with another operation gets its savepoint at the next tick after it.
"""

from __future__ import annotations

import datetime as dt
import logging

from controlplane.jobs.models import Job, JobState
from controlplane.jobs.store import job_repository
from controlplane.operations.models import ACTIVE_STATES, Operation
from controlplane.operations.services import operation_request

log = logging.getLogger(__name__)

VIA = "schedule"


def periodic_prefix(job: Job) -> str:
    """The tag names (without `tags/`) of `job`'s periodic savepoints start with this."""
    return f"periodic-{job.branch.replace('/', '-')}-"


def periodic_tags(job: Job) -> list[tuple[str, str]]:
    """(tag name, snapshot id) of `job`'s periodic savepoints, newest first."""
    prefix = periodic_prefix(job)
    refs = job_repository(job).list_refs(f"tags/{prefix}")
    found = [(name.removeprefix("tags/"), ref.target) for name, ref in refs.items()]
    return sorted(found, reverse=True)  # the names end in their UTC time


def schedule_data(job: Job) -> dict[str, object]:
    """A job's periodic-savepoint setting and the savepoints it keeps, newest first (what the
    CLI's `--json` and the REST `savepoint-schedule` resource show)."""
    return {
        "job": job.name,
        "interval_s": job.savepoint_interval_s,
        "retention": job.savepoint_retention,
        "savepoints": [{"tag": name, "snapshot": sid} for name, sid in periodic_tags(job)],
    }


def _due(job: Job, now: dt.datetime) -> bool:
    last = (
        Operation.objects.filter(job=job, kind="savepoint", requested_via=VIA)
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    return last is None or now - last >= dt.timedelta(seconds=job.savepoint_interval_s)


def request_due_savepoints(now: dt.datetime) -> int:
    """Request the periodic savepoints that are due; the number requested."""
    requested = 0
    for job in Job.objects.filter(savepoint_interval_s__gt=0, state=JobState.RUNNING):
        if Operation.objects.filter(job=job, state__in=ACTIVE_STATES).exists():
            continue
        if not _due(job, now):
            continue
        name = f"{periodic_prefix(job)}{now:%Y%m%dT%H%M%SZ}"
        try:
            operation_request(
                kind="savepoint",
                application=job.application,
                job=job,
                params={"name": name},
                via=VIA,
                reason=f"periodic savepoint (every {job.savepoint_interval_s} s)",
            )
        except Exception as exc:  # no commit yet, another operation won the race …
            log.info("periodic savepoint of %s not requested: %s", job.name, exc)
            continue
        requested += 1
    return requested


def prune_periodic_savepoints() -> int:
    """Delete each job's periodic savepoint tags beyond its retention; the number deleted."""
    removed = 0
    for job in Job.objects.filter(savepoint_retention__gt=0).exclude(savepoint_interval_s=0):
        try:
            tags = periodic_tags(job)
            repo = job_repository(job)
            for name, target in tags[job.savepoint_retention :]:
                repo.delete_ref(
                    f"tags/{name}",
                    target,
                    reason=f"periodic savepoint retention: keep the newest "
                    f"{job.savepoint_retention}",
                )
                removed += 1
        except Exception:
            log.warning("periodic savepoints of %s not pruned", job.name, exc_info=True)
    return removed
