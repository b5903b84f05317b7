"""How each job is doing, at a glance: its head, how long ago it committed, how much input
waits, which operation runs, and an alarm in words when it stopped committing or failed.

Input backlog is what the job's source holds beyond the head's offsets. File-directory
sources know it (bytes of JSON lines, rows of Parquet); for other sources it is unknown.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from controlplane.jobs.models import Job, JobState
from controlplane.jobs.selectors import UNKNOWN, ShownState, job_shown_state, runs_watched_at
from controlplane.lineage.models import Branch, Snapshot
from controlplane.operations.models import ACTIVE_STATES, Operation


@dataclass(frozen=True)
class InputBacklog:
    amount: int
    unit: str  # "bytes" | "rows"


@dataclass(frozen=True)
class JobHealth:
    job: Job
    head: Snapshot | None
    last_commit_age_s: float | None
    backlog: InputBacklog | None
    operation: Operation | None
    level: str
    """"ok", "idle" (not running), "warn" or "alarm"."""
    shown: ShownState
    """The state to show: the recorded one, or `unknown` while nothing watches the run."""
    alarm: str
    """Words for warn/alarm: what is wrong and what to look at."""

    @property
    def last_commit_at(self) -> datetime | None:
        return None if self.head is None else self.head.created_at


def stall_after_s() -> float:
    """A running job with input waiting and no commit for this long raises an alarm."""
    return float(settings.EPOCHAL_STALL_AFTER_S)


# -- input backlog --------------------------------------------------------------------------


_load_lock = threading.Lock()
#: How long a job that could not be loaded here is not tried again (seconds).
RETRY_LOAD_AFTER_S = 5.0
_sources: dict[tuple[str, str], Any] = {}
_failed: dict[tuple[str, str], float] = {}


def _source(job_ref: str, job_args: str) -> Any:
    """The engine source a job version reads (None when the job cannot be loaded here).

    A loaded source is kept for the life of the process; a failure only for a few seconds:
    the package naming the job may be installed next (the web process must see it without a
    restart), so the import system's caches are dropped and the load tried again."""
    from runners.engine.main import load_job

    key = (job_ref, job_args)
    if key in _sources:
        return _sources[key]
    with _load_lock:
        if time.monotonic() - _failed.get(key, -RETRY_LOAD_AFTER_S) < RETRY_LOAD_AFTER_S:
            return None
        if key in _failed:
            importlib.invalidate_caches()  # directories' listings the import system kept
        try:
            source = load_job(job_ref, json.loads(job_args)).source
        except (SystemExit, Exception):
            _failed[key] = time.monotonic()
            return None
        _failed.pop(key, None)
        if len(_sources) >= 256:
            _sources.clear()
        _sources[key] = source
        return source


def input_backlog(job: Job, offsets: Mapping[str, Mapping[str, int]]) -> InputBacklog | None:
    """Input the job's source holds beyond `offsets` (a snapshot's), or None when unknown."""
    from runners.engine.sources import JsonLinesDirectory, ParquetDirectory, _data_files

    job_args = json.dumps(job.version.config.get("job_args") or {}, sort_keys=True)
    source = _source(job.version.job, job_args)
    if not isinstance(source, JsonLinesDirectory | ParquetDirectory):
        return None
    committed = offsets.get(source.name, {})
    pending = 0
    try:
        if isinstance(source, JsonLinesDirectory):
            for name in _data_files(source.path, ".jsonl"):
                size = os.path.getsize(os.path.join(source.path, name))
                pending += max(0, size - int(committed.get(name, 0)))
            return InputBacklog(pending, "bytes")
        for name in _data_files(source.path, ".parquet"):
            pending += max(0, source._num_rows(name) - int(committed.get(name, 0)))
        return InputBacklog(pending, "rows")
    except (OSError, ValueError):
        return None


# -- health ---------------------------------------------------------------------------------


def _words(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _assess(
    job: Job,
    head: Snapshot | None,
    age: float | None,
    backlog: InputBacklog | None,
    shown: ShownState,
) -> tuple[str, str]:
    if shown.state == UNKNOWN:
        since = (
            f"since {timezone.localtime(shown.watched_at):%Y-%m-%d %H:%M:%S}"
            if shown.watched_at
            else "ever"
        )
        return "warn", (
            f"nothing has watched this job's run {since}: the control plane (its reconciler) "
            "is down or busy, so whether the job still runs is unknown"
        )
    if job.state == JobState.FAILED:
        return "alarm", job.status_reason or "the job failed; see its last run's log"
    if job.state not in (JobState.RUNNING, JobState.STARTING):
        return "idle", ""
    stall = stall_after_s()
    waiting = backlog is None or backlog.amount > 0
    if age is not None and age > stall and waiting:
        what = (
            "input waits" if backlog is None else f"{backlog.amount:,} {backlog.unit} of input wait"
        )
        level = "alarm" if backlog is not None else "warn"
        return level, f"no commit for {_words(age)} while {what}: check the run's log"
    if head is None and backlog is not None and backlog.amount > 0:
        started = (timezone.now() - job.updated_at).total_seconds()
        if started > stall:
            return "alarm", f"no first commit {_words(started)} after starting: check the log"
    return "ok", ""


def job_health(jobs: Iterable[Job], *, with_backlog: bool = True) -> list[JobHealth]:
    """Health of each job, in the given order (a few queries whatever the number of jobs)."""
    jobs = list(jobs)
    if not jobs:
        return []
    app_ids = {job.application_id for job in jobs}
    names = {job.branch for job in jobs}
    heads: dict[tuple[int, str], Snapshot | None] = {
        (b.application_id, b.name): b.head
        for b in Branch.objects.filter(application_id__in=app_ids, name__in=names).select_related(
            "head"
        )
    }
    operations = {
        op.job_id: op
        for op in Operation.objects.filter(
            job_id__in=[job.pk for job in jobs], state__in=ACTIVE_STATES
        )
    }
    now = timezone.now()
    watched_at = runs_watched_at()
    result = []
    for job in jobs:
        shown = job_shown_state(job, watched_at=watched_at, now=now)
        head = heads.get((job.application_id, job.branch))
        age = None if head is None else max(0.0, (now - head.created_at).total_seconds())
        backlog = input_backlog(job, head.offsets if head else {}) if with_backlog else None
        level, alarm = _assess(job, head, age, backlog, shown)
        result.append(
            JobHealth(
                job=job,
                head=head,
                last_commit_age_s=age,
                backlog=backlog,
                operation=operations.get(job.pk),
                level=level,
                alarm=alarm,
                shown=shown,
            )
        )
    return result
