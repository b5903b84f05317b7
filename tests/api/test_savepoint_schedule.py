"""Periodic savepoints are a job setting over REST as well as in the CLI: viewers read the
setting and the savepoints kept, operators change it, every bad field is a 400 naming it
and changes nothing; the reconciler then takes them (`operations/schedule.py`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from rest_framework.test import APIClient

from controlplane.jobs.models import Job, JobState
from controlplane.operations.models import Operation
from controlplane.operations.schedule import request_due_savepoints
from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]


@pytest.mark.django_db
def test_operators_set_periodic_savepoints_and_viewers_read_them(
    lineage: Lineage, client_for: Client
) -> None:
    name = lineage.job.name
    url = f"/api/jobs/{name}/savepoint-schedule/"
    viewer, operator = client_for("viewer"), client_for("operator")

    assert viewer.get(url).json() == {
        "job": name,
        "interval_s": 0,  # off by default
        "retention": lineage.job.savepoint_retention,
        "savepoints": [],
    }
    assert viewer.patch(url, {"interval_s": 60}).status_code == 403

    changed = operator.patch(url, {"interval_s": 60, "retention": 3})
    assert changed.status_code == 200, changed.content
    assert (changed.json()["interval_s"], changed.json()["retention"]) == (60, 3)
    job = Job.objects.get(pk=lineage.job.pk)
    assert (job.savepoint_interval_s, job.savepoint_retention) == (60, 3)
    # only the fields given change
    assert operator.patch(url, {"retention": 7}).json()["interval_s"] == 60

    # the reconciler takes the setting: a running job gets a savepoint operation
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    assert request_due_savepoints(datetime.now(UTC)) == 1
    op = Operation.objects.get(job=job, kind="savepoint")
    assert op.params["name"].startswith(f"periodic-{job.branch}-")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"interval_s": 5}, "interval_s"),  # under the 10 s floor
        ({"interval_s": -1}, "interval_s"),
        ({"interval_s": "60"}, "interval_s"),
        ({"interval_s": True}, "interval_s"),
        ({"retention": -2}, "retention"),
        ({"every": 60}, "every"),
        ([60], "body"),
    ],
)
def test_a_bad_field_is_a_400_naming_it_and_changes_nothing(
    lineage: Lineage, client_for: Client, body: object, field: str
) -> None:
    response = client_for("operator").patch(
        f"/api/jobs/{lineage.job.name}/savepoint-schedule/", body, format="json"
    )
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()
    job = Job.objects.get(pk=lineage.job.pk)
    before = (lineage.job.savepoint_interval_s, lineage.job.savepoint_retention)
    assert (job.savepoint_interval_s, job.savepoint_retention) == before


@pytest.mark.django_db
def test_an_unknown_job_is_a_404(client_for: Client) -> None:
    response = client_for("viewer").get("/api/jobs/nope/savepoint-schedule/")
    assert response.status_code == 404
