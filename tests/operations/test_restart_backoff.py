"""The restart policy's timing: a job whose run failed is restarted in the same reconciler tick
the failure is seen (no back-off for the first restart), later restarts wait
`restart_backoff_s`, doubling."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.jobs.models import DesiredState, Job, Run, RunPhase
from controlplane.jobs.services import job_create
from controlplane.operations.models import Operation
from controlplane.operations.reconciler import reconcile_jobs, watch_runs
from tests.conftest import registered_store

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def job(tmp_path: Path) -> Job:
    (tmp_path / "input").mkdir()
    app = Application.objects.create(
        name="clicks",
        store_namespace="clicks",
        store=registered_store(f"file://{tmp_path / 'store'}"),
    )
    version = ApplicationVersion.objects.create(
        application=app,
        number=1,
        job="clickstream",
        config={"job_args": {"directory": str(tmp_path / "input")}},
    )
    job = job_create(name="clicks-main", application=app, version=version, parallelism=2)
    Job.objects.filter(pk=job.pk).update(desired_state=DesiredState.RUNNING, restart_backoff_s=10)
    return job


def a_run(job: Job, run_id: str, **fields: object) -> Run:
    """A row of a local run of the job (the reconciler reads rows; no process behind it)."""
    return Run.objects.create(
        job=job, run_id=run_id, runner="local", parallelism=2, spec={}, **fields
    )


def fail_a_run(job: Job, run_id: str) -> None:
    """A run of the job that ended failed, and no operation active (the last start is done)."""
    Operation.objects.filter(job=job).update(state="succeeded")
    a_run(
        job, run_id, phase=RunPhase.FAILED, reason="killed by SIGKILL", finished_at=timezone.now()
    )


def restarts_requested(job: Job) -> list[Operation]:
    return list(Operation.objects.filter(job=job, kind="start", requested_via="reconciler"))


def test_first_restart_at_once_then_doubling_back_off(job: Job) -> None:
    fail_a_run(job, "run1")
    assert watch_runs() == {"runs_checked": 0, "restarts_requested": 1}
    job.refresh_from_db()
    assert job.restarts == 1 and job.next_restart_at is None
    [first] = restarts_requested(job)
    assert "run run1 failed (killed by SIGKILL)" in first.reason

    for run_id, wait_s in (("run2", 10), ("run3", 20)):
        fail_a_run(job, run_id)
        before = timezone.now()
        assert reconcile_jobs() == (0, 0)  # the back-off is scheduled, nothing requested
        job.refresh_from_db()
        assert job.state == "failed" and f"in {wait_s} s" in job.status_reason
        assert job.next_restart_at is not None
        waits = (job.next_restart_at - before).total_seconds()
        assert wait_s - 1 < waits <= wait_s + 1
        assert reconcile_jobs() == (0, 0)  # still waiting
        Job.objects.filter(pk=job.pk).update(next_restart_at=timezone.now() - dt.timedelta(1))
        assert reconcile_jobs() == (0, 1)
    job.refresh_from_db()
    assert job.restarts == 3 and len(restarts_requested(job)) == 3


def test_a_run_that_stays_up_gives_the_restart_budget_back(job: Job) -> None:
    """`restarts` counts a crash loop, not a lifetime: after a run has been up
    EPOCHAL_RESTART_RESET_AFTER_S (10 min) the next failure is a first one again."""
    Job.objects.filter(pk=job.pk).update(restarts=4, max_restarts=5)
    a_run(job, "young", phase=RunPhase.RUNNING, started_at=timezone.now() - dt.timedelta(minutes=2))
    reconcile_jobs()
    job.refresh_from_db()
    assert job.restarts == 4  # 2 minutes prove nothing yet

    Run.objects.filter(run_id="young").update(started_at=timezone.now() - dt.timedelta(minutes=11))
    reconcile_jobs()
    job.refresh_from_db()
    assert job.restarts == 0

    # so the next crash is restarted at once instead of being the fifth and last
    Run.objects.filter(run_id="young").update(phase=RunPhase.FAILED, finished_at=timezone.now())
    assert reconcile_jobs() == (0, 1)
    job.refresh_from_db()
    assert job.restarts == 1 and job.next_restart_at is None


def test_a_run_stopped_without_the_control_plane_asking_starts_again_at_once(job: Job) -> None:
    """The control plane's own shutdown (or a signal from outside) stopped the run while the
    job should run: the reconciler starts it again from the head — once, at once, without
    spending the restart budget — and says why."""
    from controlplane.jobs.services import SHUTDOWN_REASON

    Operation.objects.filter(job=job).update(state="succeeded")
    Job.objects.filter(pk=job.pk).update(state="stopped", status_reason=SHUTDOWN_REASON)
    a_run(job, "shut", phase=RunPhase.STOPPED, reason=SHUTDOWN_REASON, finished_at=timezone.now())
    assert watch_runs() == {"runs_checked": 0, "restarts_requested": 1}
    [start] = restarts_requested(job)
    assert f"run shut was {SHUTDOWN_REASON}" in start.reason
    job.refresh_from_db()
    assert job.restarts == 0 and job.desired_state == "running"

    start.state = "failed"  # however the start ends, it is asked for once per stopped run
    start.save(update_fields=["state"])
    assert watch_runs()["restarts_requested"] == 0
    assert len(restarts_requested(job)) == 1


def test_a_run_that_ended_says_why_in_the_jobs_reason(job: Job) -> None:
    Operation.objects.filter(job=job).update(state="succeeded")
    a_run(job, "done", phase=RunPhase.SUCCEEDED, reason="max epochs 3", finished_at=timezone.now())
    reconcile_jobs()
    job.refresh_from_db()
    assert job.state == "stopped" and job.desired_state == "stopped"
    assert job.status_reason == "the run ended: max epochs 3"
