"""The overview's table follows the change feed: its fragment, asked with its ETag and
``?watch=S``, waits until a job or an operation changes (woken by PostgreSQL's NOTIFY) and
answers the new table, or 304 when nothing changed — no timer on the page."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection
from django.test import Client

from controlplane.jobs.models import Job
from controlplane.operations.models import Operation
from tests.web.conftest import Lineage

ClientFor = Callable[[str | None], Client]
HTMX = {"HTTP_HX_REQUEST": "true"}


def _later(seconds: float, change: Callable[[], None]) -> threading.Thread:
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
def no_ageing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overview's ETag also carries a 30 s clock bucket (`web.live.AGE_BUCKET_S`) so it
    ages; a bucket ending mid-test would answer a fresh table that no change caused (CI saw
    it once). This test is about changes, so its clock bucket never ends."""
    monkeypatch.setattr("web.live.AGE_BUCKET_S", 10**12)


@pytest.mark.django_db(transaction=True)
def test_the_overview_waits_for_a_change_instead_of_polling(
    postgresql_db: None, client_for: ClientFor, lineage: Lineage, no_ageing: None
) -> None:
    viewer = client_for("viewer")
    page = viewer.get("/?q=clicks").content.decode()
    assert "every 3s" not in page and 'hx-trigger="load, epochal:watch"' in page
    assert "watch=25" in page and "q=clicks" in page  # the filters stay on the live request
    first = viewer.get("/?q=clicks", **HTMX)
    etag = first["ETag"]

    started = time.monotonic()
    quiet = viewer.get("/?q=clicks&watch=1", HTTP_IF_NONE_MATCH=etag, **HTMX)
    assert quiet.status_code == 304 and time.monotonic() - started >= 1.0

    # a job's state changes in another connection: the waiting request answers at once
    thread = _later(0.5, lambda: Job.objects.filter(pk=lineage.job.pk).update(state="failed"))
    started = time.monotonic()
    moved = viewer.get("/?q=clicks&watch=30", HTTP_IF_NONE_MATCH=etag, **HTMX)
    thread.join()
    assert moved.status_code == 200 and moved["ETag"] != etag
    assert 0.4 < time.monotonic() - started < 10
    assert 'class="level-alarm" data-job="clicks-main"' in moved.content.decode()

    # an operation created (any kind of the feed's `operation:*`) wakes it too
    etag = moved["ETag"]
    thread = _later(
        0.5,
        lambda: Operation.objects.create(
            kind="savepoint", application=lineage.application, job=lineage.job, state="pending"
        ),
    )
    again = viewer.get("/?q=clicks&watch=30", HTTP_IF_NONE_MATCH=etag, **HTMX)
    thread.join()
    assert again.status_code == 200 and again["ETag"] != etag
    assert "savepoint" in again.content.decode()
