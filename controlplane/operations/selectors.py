"""Reads for operations."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q, QuerySet
from django.utils.dateparse import parse_datetime

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.changes.keys import operation_key
from controlplane.changes.models import Change
from controlplane.changes.selectors import revision_subquery
from controlplane.errors import NotFound
from controlplane.jobs.models import Job, JobSummary, Run, Watch
from controlplane.jobs.selectors import (
    RUN_WATCH,
    ShownState,
    is_unwatched,
    job_not_found,
    job_shown_state,
)
from controlplane.lineage.models import Snapshot
from controlplane.lineage.selectors import SnapshotSummary, summary_columns, summary_of_row
from controlplane.operations.models import ACTIVE_STATES, Operation
from controlplane.plain_rows import Columns, split


def operation_get(*, operation_id: str) -> Operation:
    """The operation, with its `revision` (`controlplane.changes`) read in the same query."""
    try:
        key = uuid.UUID(str(operation_id))
        return (
            Operation.objects.select_related("application", "job", "requested_by")
            .annotate(revision=revision_subquery(operation_key(key)))
            .get(pk=key)
        )
    except (Operation.DoesNotExist, ValueError):
        raise _operation_not_found(operation_id) from None


def operation_revision(*, operation_id: str) -> tuple[uuid.UUID, int]:
    """(id, revision) of the operation in one plain statement (a conditional read that finds
    it unchanged asks nothing else)."""
    try:
        key = uuid.UUID(str(operation_id))
    except ValueError:
        raise _operation_not_found(operation_id) from None
    sql = (
        f"SELECT (SELECT MAX(c.id) FROM {Change._meta.db_table} c WHERE c.key = %s) "
        f"FROM {Operation._meta.db_table} o WHERE o.id = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql, [operation_key(key), Operation._meta.pk.get_db_prep_value(key, connection)]
        )
        row = cursor.fetchone()
    if row is None:
        raise _operation_not_found(operation_id)
    return key, int(row[0] or 0)


def _operation_not_found(operation_id: str) -> NotFound:
    return NotFound(
        f"no operation {operation_id}; list operations with GET /api/operations/",
        code="operation_not_found",
    )


def operation_list(
    *,
    job: str | None = None,
    application: str | None = None,
    kind: str | None = None,
    state: str | None = None,
    requester: str | None = None,
    before: datetime | None = None,
) -> QuerySet[Operation]:
    """Operations, newest first. `requester`: a username, or a way of asking (`cli`, `web`,
    `api`, `reconciler`, `autoscaler`) for the requests that came that way."""
    ops = Operation.objects.select_related("application", "job", "requested_by").order_by(
        "-created_at"
    )
    if before is not None:
        ops = ops.filter(created_at__lt=before)
    if requester:
        ops = ops.filter(Q(requested_by__username=requester) | Q(requested_via=requester))
    if job:
        ops = ops.filter(job__name=job)
    if application:
        ops = ops.filter(application__name=application)
    if kind:
        ops = ops.filter(kind=kind)
    if state:
        ops = ops.filter(state=state)
    return ops


def operation_active_for_job(*, job_id: int) -> Operation | None:
    return Operation.objects.filter(job_id=job_id, state__in=ACTIVE_STATES).first()


def operation_for_idempotency_key(*, user: Any, idempotency_key: str) -> Operation | None:
    """The operation `user` requested with `idempotency_key` (added for the REST API)."""
    if not idempotency_key or user is None or not getattr(user, "is_authenticated", False):
        return None
    return (
        Operation.objects.select_related("application", "job", "requested_by")
        .filter(requested_by=user, idempotency_key=idempotency_key)
        .first()
    )


_OVERVIEW_PARTS: list[Columns] = []


def _overview_parts() -> list[Columns]:
    if not _OVERVIEW_PARTS:
        _OVERVIEW_PARTS.extend(
            [
                Columns(Job, "j"),
                Columns(Application, "a"),
                Columns(ApplicationVersion, "v"),
                Columns(Run, "r"),
                Columns(Operation, "o"),
                Columns(get_user_model(), "u"),
            ]
        )
    return _OVERVIEW_PARTS


def job_overview(*, name: str) -> Job:
    """Job `name` in one statement with its application, version, newest run (`latest_run`,
    None before the first) and active operation (`active_operation`, with who asked): both
    read through the job's summary row (`JobSummary`, kept current by the writers), not
    searched for. A plain statement (`controlplane.plain_rows`): the job read is the API's
    most frequent, and compiling the equivalent queryset cost more than running it."""
    parts = _overview_parts()
    sql = (
        f"SELECT {', '.join(p.select() for p in parts)} "
        f"FROM {Job._meta.db_table} j "
        f"JOIN {Application._meta.db_table} a ON a.id = j.application_id "
        f"JOIN {ApplicationVersion._meta.db_table} v ON v.id = j.version_id "
        f"LEFT JOIN {JobSummary._meta.db_table} m ON m.job_id = j.id "
        f"LEFT JOIN {Run._meta.db_table} r ON r.id = m.latest_run_id "
        f"LEFT JOIN {Operation._meta.db_table} o ON o.id = m.active_operation_id "
        f"LEFT JOIN {get_user_model()._meta.db_table} u ON u.id = o.requested_by_id "
        "WHERE j.name = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [name])
        row = cursor.fetchone()
    if row is None:
        raise job_not_found(name)
    job, application, version, run, operation, requested_by = split(row, parts)
    job.application = application
    job.version = version
    version.application = application
    job.latest_run = run  # type: ignore[attr-defined]
    if run is not None:
        run.job = job
    job.active_operation = operation  # type: ignore[attr-defined]
    if operation is not None:  # the operation's own links, without asking again
        operation.application = application
        operation.job = job
        operation.requested_by = requested_by
    return job


@dataclass(frozen=True)
class JobMark:
    """What a conditional read of a job needs first: its id, its revision and its branch's
    head (None before the first commit)."""

    job_id: int
    revision: int
    head: SnapshotSummary | None
    #: the job's recorded state and when the reconciler last watched every live run: what
    #: `jobs.selectors.job_shown_state` needs to tell `unknown` (part of the ETag)
    state: str = ""
    watched_at: datetime | None = None

    def shown(self, job: Any) -> ShownState:
        """The job's state as far as anyone knows (`unknown` when nobody watches its run)."""
        return job_shown_state(job, watched_at=self.watched_at)

    @property
    def unwatched(self) -> bool:
        """Whether the job should be running but nothing has watched its run for a while."""
        return is_unwatched(self.state, self.watched_at)


def job_mark(*, name: str) -> JobMark:
    """Job `name`'s id, revision and head in one plain statement: a conditional read that
    finds the job unchanged (304) asks nothing else, and one that does not has the head."""
    sql = (
        f"SELECT j.id, (SELECT MAX(c.id) FROM {Change._meta.db_table} c "
        f"WHERE c.key = %s || j.id), j.state, "
        f"(SELECT w.at FROM {Watch._meta.db_table} w WHERE w.name = %s), "
        f"{summary_columns('s')} "
        f"FROM {Job._meta.db_table} j "
        f"LEFT JOIN {JobSummary._meta.db_table} m ON m.job_id = j.id "
        f"LEFT JOIN {Snapshot._meta.db_table} s ON s.id = m.head_id "
        "WHERE j.name = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, ["job:", RUN_WATCH, name])
        row = cursor.fetchone()
    if row is None:
        raise job_not_found(name)
    watched_at = row[3]
    if isinstance(watched_at, str):  # SQLite hands a subquery's datetime back as UTC text
        watched_at = parse_datetime(watched_at)
    if watched_at is not None and watched_at.tzinfo is None:  # ... or as a naive UTC one
        watched_at = watched_at.replace(tzinfo=UTC)
    return JobMark(int(row[0]), int(row[1] or 0), summary_of_row(row[4:]), str(row[2]), watched_at)


OVERVIEW_KEYS = ("job:*", "operation:*")
"""What the overview shows changes with any job or operation (`wait_for_change` kinds)."""


def overview_revision(*, operations: int = 8) -> int:
    """A revision of the overview (every job, the newest `operations` operations): the
    newest change among them, moved also by a job's removal (the count). Plain statements,
    one index probe per job and per operation."""
    job_table, change_table = Job._meta.db_table, Change._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*), COALESCE(MAX(r), 0) FROM (SELECT (SELECT MAX(c.id) FROM "
            f"{change_table} c WHERE c.key = %s || j.id) AS r FROM {job_table} j) t",
            ["job:"],
        )
        jobs, newest = cursor.fetchone()
    keys = [
        operation_key(pk)
        for pk in Operation.objects.order_by("-created_at").values_list("pk", flat=True)[
            :operations
        ]
    ]
    if keys:
        with connection.cursor() as cursor:
            marks = ", ".join(["%s"] * len(keys))
            cursor.execute(f"SELECT MAX(id) FROM {change_table} WHERE key IN ({marks})", keys)
            newest = max(int(newest), int(cursor.fetchone()[0] or 0))
    # a removed job lowers the count; the count is folded in so the revision still moves
    return int(newest) * 100_003 + int(jobs)
