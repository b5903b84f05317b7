"""A job the database calls running, whose run nobody has watched lately (the control plane
was down), reads `unknown` over REST as it does in `epochal jobs` and on the dashboard; the
job read's ETag changes when it does, so a client holding the old body is not told 304."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.jobs.models import JobState
from controlplane.jobs.services import watch_record
from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]


@pytest.mark.django_db
def test_an_unwatched_running_job_reads_unknown_and_its_etag_moves(
    lineage: Lineage, client_for: Client, settings: object
) -> None:
    viewer = client_for("viewer")
    name = lineage.job.name
    type(lineage.job).objects.filter(pk=lineage.job.pk).update(
        state=JobState.RUNNING, status_reason="started"
    )

    watch_record(timezone.now() - timedelta(hours=1))  # the reconciler's last pass: long ago
    stale = viewer.get(f"/api/jobs/{name}/")
    assert stale.status_code == 200
    body = stale.json()
    assert body["state"] == "running"  # what the database recorded
    assert (body["observed_state"], body["observed_reason"]) == (
        "unknown",
        "control plane was down",
    )
    listed = {j["name"]: j for j in viewer.get("/api/jobs/").json()["results"]}
    assert listed[name]["observed_state"] == "unknown"

    watch_record()  # the reconciler is back and has just checked every live run
    fresh = viewer.get(f"/api/jobs/{name}/", HTTP_IF_NONE_MATCH=stale["ETag"])
    assert fresh.status_code == 200, "the shown state changed: the old ETag must not match"
    assert (fresh.json()["observed_state"], fresh.json()["observed_reason"]) == (
        "running",
        "started",
    )
    assert fresh["ETag"] != stale["ETag"]
    assert viewer.get(f"/api/jobs/{name}/", HTTP_IF_NONE_MATCH=fresh["ETag"]).status_code == 304
    listed = {j["name"]: j for j in viewer.get("/api/jobs/").json()["results"]}
    assert listed[name]["observed_state"] == "running"


@pytest.mark.django_db
def test_a_stopped_job_is_never_unknown(lineage: Lineage, client_for: Client) -> None:
    viewer = client_for("viewer")
    type(lineage.job).objects.filter(pk=lineage.job.pk).update(
        state=JobState.STOPPED, status_reason="stopped on request"
    )
    # no watch recorded at all: nothing should be running, so nothing is unknown
    body = viewer.get(f"/api/jobs/{lineage.job.name}/").json()
    assert (body["observed_state"], body["observed_reason"]) == ("stopped", "stopped on request")
