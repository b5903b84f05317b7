"""The reconciler's restart policy: a job whose run dies is restarted from its branch head
after a back-off; a job that keeps failing is given up after `max_restarts`, with the reason."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.e2e.harness import ControlPlane, wait_for

pytestmark = [pytest.mark.services, pytest.mark.spark]


def test_a_killed_run_is_restarted_from_the_head(control_plane: ControlPlane) -> None:
    from controlplane.jobs.models import Job, Run

    plane = control_plane
    plane.add_input(files=2)
    plane.register()
    Job.objects.filter(name="clicks-main").update(restart_backoff_s=1)
    plane.start_worker()
    plane.manage("start", "clicks-main")
    head = plane.wait_caught_up()
    [first] = Run.objects.filter(job__name="clicks-main")
    pid = json.loads((plane.tmp / "var" / "runs" / first.run_id / "pid").read_text())["pid"]
    os.killpg(pid, signal.SIGKILL)  # the driver dies (OOM, node lost …)

    wait_for(
        lambda: (
            Run.objects.filter(job__name="clicks-main", phase="running")
            .exclude(run_id=first.run_id)
            .first()
        ),
        timeout=180,
        what="the reconciler to restart the job",
    )
    first.refresh_from_db()
    assert first.phase == "failed" and "without recording an exit status" in first.reason
    job = Job.objects.get(name="clicks-main")
    assert job.restarts == 1 and job.state == "running"
    from controlplane.operations.models import Operation

    restart = wait_for(
        lambda: Operation.objects.filter(
            kind="start", requested_via="reconciler", state="succeeded"
        ).first(),
        timeout=120,
        what="the restart operation to succeed",
    )
    assert first.run_id in restart.reason
    plane.add_input(files=3)  # the restarted run goes on from the head
    assert plane.wait_caught_up() != head
    assert plane.head()[1].parents == (head,)


def test_a_job_that_keeps_failing_is_given_up(control_plane: ControlPlane) -> None:
    from controlplane.jobs.models import Job
    from controlplane.operations.models import Operation

    plane = control_plane
    plane.add_input(files=1)
    plane.manage(
        "register",
        "broken",
        "--job",
        "broken-job",
        "--job-name",
        "broken-main",
    )
    Job.objects.filter(name="broken-main").update(max_restarts=2, restart_backoff_s=1)
    plane.start_worker()
    out = plane.manage("start", "broken-main", check=False)
    assert "start failed" in out and "no_such_job" in out, out

    job = wait_for(
        lambda: Job.objects.filter(
            name="broken-main", state="failed", restarts=2, status_reason__contains="gave up"
        ).first(),
        timeout=240,
        what="the reconciler to give up",
    )
    assert job.desired_state == "stopped"
    assert Operation.objects.filter(kind="start", requested_via="reconciler").count() == 2
    assert job.runs.count() == 3 and not job.runs.filter(phase__in=["pending", "running"])

    # a person starting it again gives it its whole restart budget back: two more restarts
    out = plane.manage("start", "broken-main", check=False)
    assert "start failed" in out and "no_such_job" in out, out

    def given_up_again() -> Job | None:
        job = Job.objects.get(name="broken-main")
        runs = job.runs.count()  # 3 before, the person's start and two restarts
        gave_up = job.state == "failed" and "gave up" in job.status_reason
        return job if runs == 6 and gave_up and job.restarts == 2 else None

    wait_for(given_up_again, timeout=240, what="the reconciler to give up a second time")
    assert Operation.objects.filter(kind="start", requested_via="reconciler").count() == 4
