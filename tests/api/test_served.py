"""Watches through the real web server (the one the Helm chart and the image run), not
Django's test client: a waiting watch holds one of a worker's Python threads and nothing
else, every worker process starts its own change listener (``LISTEN``), and a change
committed by another process wakes the watches of every worker; at most
`EPOCHAL_WATCH_SLOTS` wait per process, the rest answer at once as busy, and the threads
left over keep serving other requests."""

from __future__ import annotations

import http.client
import secrets
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from bench.api import serve
from controlplane.operations.models import Operation, OperationState
from tests.api.conftest import Lineage, current_database_url
from tests.security.servers import SERVER

WORKERS = 2
WATCHES = 16


def _get(port: int, path: str, token: str, etag: str = "") -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=90)
    headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
    if etag:
        headers["If-None-Match"] = etag
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def _listeners() -> int:
    """Change listeners connected to this test's database (one per process that has one)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'epochal-changes' AND datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def _until(condition: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {seconds:g}s")
        time.sleep(0.1)


@pytest.fixture
def served(
    postgresql_db: None, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[int]:
    """The server as deployed (`SERVER`) serving this test's database: `WORKERS` processes
    (or `(workers, watch slots)` as the test's parameter) with watch slots for every watch
    a test sends, wherever the kernel puts its connection, and 4 threads more."""
    monkeypatch.setenv("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    workers, slots = getattr(request, "param", (WORKERS, WATCHES))
    with serve(
        current_database_url(),
        server=SERVER,
        workers=workers,
        threads=slots + 4,
        watch_slots=slots,
        db_pool=2,
    ) as (port, _):
        yield port


@pytest.mark.django_db(transaction=True)
def test_a_change_wakes_the_watches_of_every_worker_process(
    served: int, lineage: Lineage, tokens: dict[str, str]
) -> None:
    running = Operation.objects.create(
        kind="savepoint",
        application=lineage.application,
        job=lineage.job,
        state=OperationState.RUNNING,
    )
    path = f"/api/jobs/{lineage.job.name}/"
    token = tokens["viewer"]
    etag = _get(served, path, token).getheader("ETag") or ""
    assert etag
    answers: list[tuple[int, str]] = []
    lock = threading.Lock()

    def watch() -> None:
        response = _get(served, f"{path}?watch=60", token, etag)
        with lock:
            answers.append((response.status, response.getheader("ETag") or ""))

    # connections are spread over the workers (the kernel's choice): 16 watches reach both
    # (all on one: a chance of 1 in 32,768), and each worker starts its own listener for
    # its first watch
    watchers = [threading.Thread(target=watch) for _ in range(WATCHES)]
    for thread in watchers:
        thread.start()
    _until(lambda: _listeners() == WORKERS, f"{WORKERS} listeners (one per worker)")
    assert not answers  # nothing changed: all of them are waiting

    Operation.objects.filter(pk=running.pk).update(progress=0.5)  # committed, notified
    for thread in watchers:
        thread.join(timeout=90)
    assert len(answers) == WATCHES
    # woken by the change (a watch that ran out would answer 304 after 60 s)
    assert {status for status, _ in answers} == {200}
    assert all(tag and tag != etag for _, tag in answers)
    assert _listeners() == WORKERS  # the listeners stay for the next watches


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("served", [(1, 1)], indirect=True)
def test_a_watch_beyond_the_slots_answers_busy_and_other_requests_are_still_served(
    served: int, lineage: Lineage, tokens: dict[str, str]
) -> None:
    path = f"/api/jobs/{lineage.job.name}/"
    token = tokens["viewer"]
    etag = _get(served, path, token).getheader("ETag") or ""
    held: list[int] = []
    holder = threading.Thread(
        target=lambda: held.append(_get(served, f"{path}?watch=60", token, etag).status)
    )
    holder.start()
    # the holder has the process's one slot once it waits (its listener is then connected)
    _until(lambda: _listeners() == 1, "waiting")

    turned_away = _get(served, f"{path}?watch=60", token, etag)
    assert turned_away.status == 304
    assert turned_away.getheader("Epochal-Watch") == "busy"
    assert turned_away.getheader("Retry-After") == "1"
    # the waiting watch holds one thread; the others serve plain reads meanwhile
    for _ in range(4):
        assert _get(served, path, token).status == 200
        assert _get(served, "/api/jobs/", token).status == 200
    assert not held  # still waiting

    Operation.objects.create(
        kind="savepoint",
        application=lineage.application,
        job=lineage.job,
        state=OperationState.RUNNING,
    )  # a new active operation: the job's answer changes and the holder is woken
    holder.join(timeout=90)
    assert held == [200]
