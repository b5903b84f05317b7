"""Rendered answers kept by ETag (controlplane/api/response_cache.py): an unchanged answer
is served again from the process's cache without reading its rows, a change is never
served stale, only JSON is kept, and the cache stays within its byte budget."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from controlplane.api.response_cache import RESPONSES, ResponseCache
from controlplane.jobs.models import Job
from controlplane.operations.models import Operation, OperationState
from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]


def _read(client: APIClient, url: str, **headers: Any) -> tuple[Any, int]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, **headers)
    return response, len(queries.captured_queries)


def _urls(lineage: Lineage, operation: Operation) -> list[str]:
    app = lineage.application.name
    return [
        f"/api/jobs/{lineage.job.name}/",
        f"/api/operations/{operation.pk}/",
        f"/api/applications/{app}/snapshots/?rev=main&limit=2",
        f"/api/applications/{app}/lineage/?limit=3",
    ]


@pytest.fixture
def operation(lineage: Lineage) -> Operation:
    return Operation.objects.create(
        kind="savepoint",
        application=lineage.application,
        job=lineage.job,
        state=OperationState.RUNNING,
    )


@pytest.mark.django_db
def test_an_unchanged_answer_is_served_again_without_reading_its_rows(
    lineage: Lineage, operation: Operation, client_for: Client
) -> None:
    viewer = client_for("viewer")
    for url in _urls(lineage, operation):
        first, first_queries = _read(viewer, url)
        hits = RESPONSES.hits
        again, again_queries = _read(viewer, url)
        assert first.status_code == again.status_code == 200, url
        assert again.content == first.content, url
        assert again["ETag"] == first["ETag"] and again["Content-Type"] == first["Content-Type"]
        assert RESPONSES.hits == hits + 1, url
        assert again_queries < first_queries, (url, first_queries, again_queries)
        # another user with the role gets the same bytes; none without a valid token
        assert client_for("operator").get(url).content == first.content
        assert client_for(None).get(url).status_code == 401


@pytest.mark.django_db
def test_a_change_is_never_served_from_the_cache(
    lineage: Lineage, operation: Operation, client_for: Client
) -> None:
    viewer = client_for("viewer")
    job_url, operation_url = _urls(lineage, operation)[:2]
    before_job, before_operation = viewer.get(job_url), viewer.get(operation_url)
    Operation.objects.filter(pk=operation.pk).update(progress=0.75)
    Job.objects.filter(pk=lineage.job.pk).update(status_reason="moved on")
    after_job, after_operation = viewer.get(job_url), viewer.get(operation_url)
    assert after_job["ETag"] != before_job["ETag"]
    assert after_job.json()["status_reason"] == "moved on"
    assert after_job.json()["active_operation"]["progress"] == 0.75
    assert after_operation["ETag"] != before_operation["ETag"]
    assert after_operation.json()["progress"] == 0.75


@pytest.mark.django_db
def test_links_follow_the_host_and_html_is_never_kept(
    lineage: Lineage, operation: Operation, client_for: Client
) -> None:
    viewer = client_for("viewer")
    url = _urls(lineage, operation)[0]
    local = viewer.get(url, HTTP_HOST="localhost")
    loopback = viewer.get(url, HTTP_HOST="127.0.0.1")
    assert local.json()["url"].startswith("http://localhost/")
    assert loopback.json()["url"].startswith("http://127.0.0.1/")
    kept = len(RESPONSES)
    html = viewer.get(url, HTTP_ACCEPT="text/html")
    assert html.status_code == 200 and html["Content-Type"].startswith("text/html")
    assert len(RESPONSES) == kept


@pytest.mark.django_db
def test_a_zero_budget_turns_the_cache_off(
    lineage: Lineage, operation: Operation, client_for: Client, settings: Any
) -> None:
    settings.EPOCHAL_RESPONSE_CACHE_BYTES = 0
    viewer = client_for("viewer")
    url = _urls(lineage, operation)[0]
    assert viewer.get(url).content == viewer.get(url).content
    assert len(RESPONSES) == 0 and RESPONSES.hits == 0


def test_the_cache_keeps_within_its_budget_dropping_the_least_recently_used() -> None:
    cache = ResponseCache()
    limit = 8_000
    for i in range(10):
        cache.put((f"e{i}", "u", "j"), b"x" * 900, "application/json", limit)
        assert cache.get(("e0", "u", "j")) is not None  # kept in use: never the one dropped
    assert sum(len(body) for body, _ in cache._entries.values()) <= limit
    assert cache.get(("e1", "u", "j")) is None  # the oldest unused went first
    assert cache.get(("e9", "u", "j")) is not None
    cache.put(("big", "u", "j"), b"x" * (limit // 8 + 1), "application/json", limit)
    assert cache.get(("big", "u", "j")) is None  # one answer may not push out the rest
