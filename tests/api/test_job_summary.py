"""Job summaries (controlplane/jobs/summaries.py): the database keeps each job's newest run,
active operation and branch head current in the writer's own transaction — at a commit, a
run's creation, an operation's step — so a job read joins one row. Each check compares the
summary with the same facts recomputed from the rows they summarise, independently."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from controlplane.jobs.models import Job, JobSummary, Run
from controlplane.lineage.models import Branch, Snapshot
from controlplane.lineage.services import reindex_application
from controlplane.operations.models import ACTIVE_STATES, Operation, OperationState
from tests.api.conftest import Lineage, commit, current_database_url

ROOT = Path(__file__).resolve().parents[2]
Client = Callable[[str | None], APIClient]


def recomputed(job: Job) -> tuple[int | None, object, int | None]:
    """(newest run, newest active operation, branch head) from the rows themselves."""
    run = Run.objects.filter(job=job).order_by("-created_at", "-id").first()
    operation = (
        Operation.objects.filter(job=job, state__in=ACTIVE_STATES).order_by("-created_at").first()
    )
    branch = Branch.objects.filter(application_id=job.application_id, name=job.branch).first()
    return (
        None if run is None else run.pk,
        None if operation is None else operation.pk,
        None if branch is None else branch.head_id,
    )


def summary(job: Job) -> tuple[int | None, object, int | None]:
    row = JobSummary.objects.get(job=job)
    return row.latest_run_id, row.active_operation_id, row.head_id


def _head_id(lineage: Lineage, snapshot_id: str) -> int:
    return Snapshot.objects.get(application=lineage.application, snapshot_id=snapshot_id).pk


@pytest.mark.django_db(transaction=True)
def test_the_summary_is_current_after_each_commit_run_and_operation_step(
    lineage: Lineage, client_for: Client
) -> None:
    """On either database (the SQLite triggers are the same statements inlined)."""
    job = lineage.job
    assert summary(job) == recomputed(job) == (None, None, _head_id(lineage, lineage.main[-1]))

    # a commit: the branch head moves when the index records it
    head = commit(lineage.repo, "main", lineage.main[-1], 5)
    reindex_application(application=lineage.application, repo=lineage.repo)
    assert summary(job)[2] == _head_id(lineage, head)

    run = Run.objects.create(job=job, run_id="r1", runner="local", parallelism=2, spec={})
    assert summary(job)[0] == run.pk
    newer = Run.objects.create(job=job, run_id="r2", runner="local", parallelism=2, spec={})
    assert summary(job)[0] == newer.pk

    operation = Operation.objects.create(
        kind="savepoint", application=lineage.application, job=job, state=OperationState.PENDING
    )
    assert summary(job)[1] == operation.pk
    for step in (OperationState.RUNNING, OperationState.SUCCEEDED):
        operation.state = step
        operation.save()
        assert summary(job) == recomputed(job)
    assert summary(job)[1] is None

    # a deleted branch leaves the job without a head
    Branch.objects.filter(application=lineage.application, name="main").delete()
    assert summary(job) == recomputed(job) == (newer.pk, None, None)

    body = client_for("viewer").get(f"/api/jobs/{job.name}/").json()
    assert body["current_run"]["run_id"] == "r2"
    assert body["active_operation"] is None and body["head"] is None


@pytest.mark.django_db(transaction=True)
def test_a_writer_killed_mid_step_leaves_the_summary_consistent(
    postgresql_db: None, lineage: Lineage
) -> None:
    job = lineage.job
    operation = Operation.objects.create(
        kind="savepoint", application=lineage.application, job=job, state=OperationState.RUNNING
    )
    branch = Branch.objects.get(application=lineage.application, name="main")
    before = summary(job)
    assert before == recomputed(job) == (None, operation.pk, branch.head_id)
    older = _head_id(lineage, lineage.main[1])
    # another process does a whole step in one transaction — a run, the operation finishing,
    # the head moving — and is SIGKILLed before it commits
    script = f"""
import os, signal, django
django.setup()
from django.db import transaction
from controlplane.jobs.models import Run
from controlplane.lineage.models import Branch
from controlplane.operations.models import Operation
with transaction.atomic():
    Run.objects.create(job_id={job.pk}, run_id="crash", runner="local", parallelism=2, spec={{}})
    Operation.objects.filter(pk="{operation.pk}").update(state="succeeded")
    Branch.objects.filter(pk={branch.pk}).update(head_id={older})
    from controlplane.jobs.models import JobSummary
    row = JobSummary.objects.get(job_id={job.pk})
    print(row.latest_run_id is not None, row.active_operation_id, row.head_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""
    env = {**os.environ, "DATABASE_URL": current_database_url()}
    child = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert child.returncode == -9, child.stderr
    # inside its transaction the summary had followed every write of the step ...
    assert child.stdout.split() == ["True", "None", str(older)]
    # ... and with the transaction gone, so is the summary's change
    assert summary(job) == recomputed(job) == before
