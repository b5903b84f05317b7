"""The job read's hand-built body (`job_detail_representation`) is exactly what
`JobDetailSerializer` (the schema's declaration) renders: with and without a run, an active
operation and a head, through the API as served."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.test import APIClient

from controlplane.api.serializers import JobDetailSerializer, job_detail_representation
from controlplane.jobs.models import Run
from controlplane.lineage.models import Branch
from controlplane.operations.models import Operation, OperationState
from controlplane.operations.selectors import job_mark, job_overview
from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]


def _both(lineage: Lineage, client: APIClient) -> tuple[dict, dict, dict]:
    name = lineage.job.name
    request = Request(RequestFactory().get(f"/api/jobs/{name}/"))
    job, mark = job_overview(name=name), job_mark(name=name)
    context = {
        "request": request,
        "application": job.application.name,
        "current_run": job.latest_run,  # type: ignore[attr-defined]
        "active_operation": job.active_operation,  # type: ignore[attr-defined]
        "head": mark.head,
        "shown": mark.shown(job),
    }
    declared = dict(JobDetailSerializer(job, context=context).data)
    built = job_detail_representation(job, context)
    served = client.get(f"/api/jobs/{name}/").json()
    return declared, built, served


@pytest.mark.django_db
def test_the_built_job_body_equals_the_serializer_s(lineage: Lineage, client_for: Client) -> None:
    viewer = client_for("viewer")
    Branch.objects.filter(application=lineage.application, name="main").delete()
    declared, built, served = _both(lineage, viewer)
    assert built == declared  # no run, no operation, no head
    assert served["current_run"] is None and served["head"] is None

    Branch.objects.create(
        application=lineage.application, name="main", head_id=_head(lineage), reflog_seq=9
    )
    now = timezone.now()
    Run.objects.create(
        job=lineage.job,
        run_id="r-7",
        runner="local",
        parallelism=3,
        spec={},
        phase="running",
        reason="a restart",
        started_at=now - timedelta(seconds=5),
    )
    Operation.objects.create(
        kind="savepoint",
        application=lineage.application,
        job=lineage.job,
        state=OperationState.RUNNING,
        phases=[{"name": "commit", "state": "running", "progress": 0.5, "detail": "x"}],
    )
    declared, built, served = _both(lineage, viewer)
    assert built == declared
    assert built["current_run"]["run_id"] == "r-7" and built["active_operation"] is not None
    assert built["head"]["snapshot_id"] == lineage.main[-1]
    # what the server sends: the same fields and values (URLs are absolute to its host)
    assert served.keys() == built.keys()
    assert {k: v for k, v in served.items() if k not in ("url", "head", "active_operation")} == {
        k: v for k, v in built.items() if k not in ("url", "head", "active_operation")
    }


def _head(lineage: Lineage) -> int:
    from controlplane.lineage.models import Snapshot

    return Snapshot.objects.get(application=lineage.application, snapshot_id=lineage.main[-1]).pk
