"""Periodic savepoints as a job setting: `epochal savepoints JOB --every S --keep N` sets them,
the reconciler requests a savepoint of the running job's head once per interval (a real
operation, executed here, tagging the real store) and deletes the oldest periodic tags beyond
the retention — never a savepoint somebody asked for."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.jobs.models import Job
from controlplane.jobs.store import job_repository
from controlplane.operations.executor import execute
from controlplane.operations.models import Operation
from controlplane.operations.schedule import (
    periodic_tags,
    prune_periodic_savepoints,
    request_due_savepoints,
)
from tests.cli.test_epochal import env as env  # the fixture
from tests.cli.test_epochal import epochal
from tests.operations.test_requests import commit_epochs
from tests.operations.test_requests import job as job  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def scheduled(job: Job) -> list[Operation]:
    return list(Operation.objects.filter(job=job, requested_via="schedule").order_by("created_at"))


def test_the_reconciler_takes_a_savepoint_per_interval_and_keeps_the_newest(job: Job) -> None:
    ids = commit_epochs(job, 3)
    Job.objects.filter(pk=job.pk).update(
        state="running", savepoint_interval_s=600, savepoint_retention=2
    )
    now = timezone.now()
    assert request_due_savepoints(now) == 1
    [first] = scheduled(job)
    assert first.params["name"].startswith("periodic-main-")
    assert execute(str(first.pk)) == "succeeded"
    assert periodic_tags(job) == [(first.params["name"], ids[-1])]

    assert request_due_savepoints(now + dt.timedelta(seconds=599)) == 0  # not due yet
    later = now + dt.timedelta(seconds=601)
    assert request_due_savepoints(later) == 1
    second = scheduled(job)[-1]
    assert execute(str(second.pk)) == "succeeded"

    repo = job_repository(job)
    head = repo.resolve("main")
    for old in ("periodic-main-20200101T000000Z", "periodic-main-20210101T000000Z"):
        repo.cas_ref(f"tags/{old}", None, head, reason="an older periodic savepoint")
    repo.cas_ref("tags/before-the-upgrade", None, head, reason="a person's savepoint")
    assert len(periodic_tags(job)) == 4
    assert prune_periodic_savepoints() == 2
    kept = [name for name, _ in periodic_tags(job)]
    assert kept == [second.params["name"], first.params["name"]]  # the newest two
    assert repo.read_ref("tags/before-the-upgrade") is not None


def test_a_stopped_job_gets_none_and_a_busy_one_waits(job: Job) -> None:
    commit_epochs(job, 1)
    Job.objects.filter(pk=job.pk).update(state="stopped", savepoint_interval_s=60)
    assert request_due_savepoints(timezone.now()) == 0
    Job.objects.filter(pk=job.pk).update(state="running")
    Operation.objects.create(kind="stop", application=job.application, job=job, state="running")
    assert request_due_savepoints(timezone.now()) == 0


def test_epochal_savepoints_sets_and_shows_the_schedule(
    job: Job, env: dict[str, str], tmp_path: Path
) -> None:
    out = epochal(env, tmp_path, "savepoints", job.name, "--every", "600", "--keep", "3").stdout
    assert "a savepoint every 600 s while it runs, keeping the newest 3" in out
    job.refresh_from_db()
    assert (job.savepoint_interval_s, job.savepoint_retention) == (600, 3)
    refused = epochal(env, tmp_path, "savepoints", job.name, "--every", "5", status=1)
    assert "0 (off) or at least 10 seconds" in refused.stderr
    off = epochal(env, tmp_path, "savepoints", job.name, "--every", "0").stdout
    assert "no periodic savepoints" in off
