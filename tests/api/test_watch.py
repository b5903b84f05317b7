"""Watches: a conditional read with ``?watch=S`` waits for the change and answers it at once,
woken by PostgreSQL's LISTEN/NOTIFY (a committed change in another connection), or answers
304 when none came within S seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection
from rest_framework.test import APIClient

from controlplane.changes import feed
from controlplane.operations.models import Operation, OperationState
from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]


def _later(seconds: float, change: Callable[[], None]) -> threading.Thread:
    """Run `change` in another thread (its own connection, committed) after `seconds`."""

    def run() -> None:
        time.sleep(seconds)
        try:
            change()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.fixture
def running(lineage: Lineage) -> Operation:
    return Operation.objects.create(
        kind="savepoint",
        application=lineage.application,
        job=lineage.job,
        state=OperationState.RUNNING,
    )


@pytest.mark.django_db(transaction=True)
def test_a_watch_answers_when_the_operation_moves_and_304_when_nothing_does(
    postgresql_db: None, lineage: Lineage, running: Operation, client_for: Client
) -> None:
    viewer = client_for("viewer")
    urls = [f"/api/operations/{running.pk}/", f"/api/jobs/{lineage.job.name}/"]
    for url in urls:
        etag = viewer.get(url)["ETag"]

        started = time.monotonic()
        quiet = viewer.get(f"{url}?watch=1", HTTP_IF_NONE_MATCH=etag)
        assert quiet.status_code == 304 and time.monotonic() - started >= 1.0
        assert feed._LISTENER.listening.is_set()  # woken by notifications, not polling

        progress = 0.25 + urls.index(url) * 0.5
        thread = _later(
            0.5,
            lambda p=progress: Operation.objects.filter(pk=running.pk).update(progress=p),
        )
        started = time.monotonic()
        moved = viewer.get(f"{url}?watch=30", HTTP_IF_NONE_MATCH=etag)
        waited = time.monotonic() - started
        thread.join()
        assert moved.status_code == 200 and moved["ETag"] != etag
        body = moved.json()
        assert (body.get("active_operation") or body)["progress"] == progress
        assert 0.4 < waited < 10


@pytest.mark.django_db(transaction=True)
def test_a_log_watch_ignores_commits_elsewhere(
    postgresql_db: None, lineage: Lineage, client_for: Client
) -> None:
    from controlplane.lineage.services import reindex_application
    from tests.api.conftest import commit

    viewer = client_for("viewer")
    url = "/api/applications/clicks/snapshots/?rev=main&limit=2"
    etag = viewer.get(url)["ETag"]

    def commit_on(branch: str, parent: str, epoch: int) -> None:
        commit(lineage.repo, branch, parent, epoch)
        reindex_application(application=lineage.application, repo=lineage.repo)

    thread = _later(0.3, lambda: commit_on("exp", lineage.fork[-1], 4))
    quiet = viewer.get(f"{url}&watch=2", HTTP_IF_NONE_MATCH=etag)
    thread.join()
    assert quiet.status_code == 304  # exp moved, main did not

    thread = _later(0.3, lambda: commit_on("main", lineage.main[-1], 5))
    moved = viewer.get(f"{url}&watch=30", HTTP_IF_NONE_MATCH=etag)
    thread.join()
    assert moved.status_code == 200
    assert moved.json()["results"][0]["epoch"] == 5


def test_watch_is_validated(lineage: Lineage, client_for: Client) -> None:
    viewer = client_for("viewer")
    for bad in ("-1", "abc", "100000"):
        response = viewer.get(f"/api/jobs/{lineage.job.name}/?watch={bad}")
        assert response.status_code == 400
        assert "watch" in response.json()["error"]["fields"]
