"""Every API read asks the database at most three times (authentication included), however
large the lineage behind it; conditional reads of the live resources answer 304 after at most
two. Counts come from Django's query capture against the real database."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from controlplane.jobs.models import Run
from controlplane.operations.models import Operation, OperationState
from tests.api.conftest import Lineage, commit

Client = Callable[[str | None], APIClient]
BUDGET = 3


def _reads(lineage: Lineage, operation: Operation) -> list[str]:
    app, job, snap = lineage.application.name, lineage.job.name, lineage.main[2]
    return [
        "/api/",
        "/api/applications/",
        f"/api/applications/{app}/",
        f"/api/applications/{app}/versions/",
        f"/api/applications/{app}/versions/1/",
        f"/api/applications/{app}/branches/",
        f"/api/applications/{app}/tags/",
        f"/api/applications/{app}/snapshots/",
        f"/api/applications/{app}/snapshots/?rev=exp&first_parent=true&limit=2",
        f"/api/applications/{app}/snapshots/?rev=tags/sp-1&limit=1",
        f"/api/applications/{app}/snapshots/{snap}/",
        f"/api/applications/{app}/snapshots/{snap}/diff/",
        f"/api/applications/{app}/lineage/",
        f"/api/applications/{app}/lineage/?limit=2",
        f"/api/applications/{app}/mapping/",
        "/api/jobs/",
        f"/api/jobs/{job}/",
        f"/api/jobs/{job}/runs/",
        f"/api/jobs/{job}/logs/",
        "/api/web/",
        "/api/operations/",
        f"/api/operations/?job={job}&state=running",
        f"/api/operations/{operation.pk}/",
        "/api/audit/",
        "/api/users/",
        "/api/users/viewer/",
    ]


def _busy(lineage: Lineage) -> Operation:
    """The job with a run and a running operation, so the job's detail has all its parts."""
    operation = Operation.objects.create(
        kind="savepoint",
        application=lineage.application,
        job=lineage.job,
        state=OperationState.RUNNING,
        phases=[{"name": "commit", "state": "running", "progress": 0.5, "detail": ""}],
    )
    Run.objects.create(job=lineage.job, run_id="r1", runner="local", parallelism=2, spec={})
    return operation


def test_every_read_stays_within_three_queries(
    lineage: Lineage, client_for: Client, django_assert_max_num_queries
) -> None:
    operation = _busy(lineage)
    admin = client_for("admin")
    for url in _reads(lineage, operation):
        with django_assert_max_num_queries(BUDGET):
            response = admin.get(url)
        assert response.status_code == 200, (url, response.content[:300])
    detail = admin.get(f"/api/jobs/{lineage.job.name}/").json()
    assert detail["current_run"]["run_id"] == "r1"
    assert detail["active_operation"]["id"] == str(operation.pk)
    assert detail["head"]["snapshot_id"] == lineage.main[-1]


def test_conditional_reads_answer_304_until_something_changes(
    lineage: Lineage, client_for: Client, django_assert_max_num_queries
) -> None:
    operation = _busy(lineage)
    viewer = client_for("viewer")
    app = lineage.application.name
    urls = {
        "job": f"/api/jobs/{lineage.job.name}/",
        "operation": f"/api/operations/{operation.pk}/",
        "log": f"/api/applications/{app}/snapshots/?rev=main&limit=2",
        "lineage": f"/api/applications/{app}/lineage/",
    }
    etags = {}
    for name, url in urls.items():
        first = viewer.get(url)
        assert first.status_code == 200 and first["ETag"].startswith('"'), name
        assert first["Cache-Control"] == "private, no-cache"
        etags[name] = first["ETag"]
        with django_assert_max_num_queries(2):
            again = viewer.get(url, HTTP_IF_NONE_MATCH=etags[name])
        assert again.status_code == 304, name
        assert again.content == b"" and again["ETag"] == etags[name]
        assert viewer.get(url, HTTP_IF_NONE_MATCH='"other"').status_code == 200

    # An operation step changes the operation and its job, nothing else.
    operation.progress = 0.75
    operation.save(update_fields=["progress"])
    changed = {
        n
        for n, url in urls.items()
        if viewer.get(url, HTTP_IF_NONE_MATCH=etags[n]).status_code == 200
    }
    assert changed == {"job", "operation"}
    # A lease renewal is not a change anyone can see.
    etags.update({n: viewer.get(urls[n])["ETag"] for n in ("job", "operation")})
    Operation.objects.filter(pk=operation.pk).update(lease_owner="w2")
    assert viewer.get(urls["operation"], HTTP_IF_NONE_MATCH=etags["operation"]).status_code == 304

    # A commit on main moves the head: the job, main's log and the graph change.
    from controlplane.lineage.services import reindex_application

    commit(lineage.repo, "main", lineage.main[-1], 5)
    reindex_application(application=lineage.application, repo=lineage.repo)
    changed = {
        n
        for n, url in urls.items()
        if viewer.get(url, HTTP_IF_NONE_MATCH=etags[n]).status_code == 200
    }
    assert changed == {"job", "log", "lineage"}
    fresh = viewer.get(urls["job"]).json()
    assert fresh["head"]["epoch"] == 5


@pytest.mark.parametrize("role", ["viewer"])
def test_a_stale_etag_of_a_run_change_is_refreshed(
    lineage: Lineage, client_for: Client, role: str
) -> None:
    client = client_for(role)
    url = f"/api/jobs/{lineage.job.name}/"
    etag = client.get(url)["ETag"]
    Run.objects.create(job=lineage.job, run_id="r9", runner="local", parallelism=2, spec={})
    response = client.get(url, HTTP_IF_NONE_MATCH=etag)
    assert response.status_code == 200 and response["ETag"] != etag
    assert response.json()["current_run"]["run_id"] == "r9"
