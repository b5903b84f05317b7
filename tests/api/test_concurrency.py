"""50 concurrent conflicting requests against one job: exactly one operation is accepted.

Real PostgreSQL (the partial unique index decides), a real HTTP server (`live_server`, one
thread and one database connection per request) and 50 client threads released together.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from django.core.servers.basehttp import ThreadedWSGIServer
from django.db import connection

from controlplane.operations.models import ACTIVE_STATES, Operation
from tests.api.conftest import Lineage

CLIENTS = 50
# The test server's listen backlog (10) would reset most of 50 simultaneous connects before
# any request reached the application; the production server (granian) has 1024 per worker.
ThreadedWSGIServer.request_queue_size = 128


def _wait_for_server_connections_to_close(timeout_s: float = 30.0) -> None:
    """Handler threads close their database connections after answering; wait for that, so
    the next storm (or the test database's teardown) does not meet 50 lingering sessions."""
    deadline = time.monotonic() + timeout_s
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            (others,) = cursor.fetchone()
        if others == 0 or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def _storm(url: str, token: str, body: dict[str, Any]) -> list[requests.Response]:
    barrier = threading.Barrier(CLIENTS)

    def one(_: int) -> requests.Response:
        with requests.Session() as session:
            barrier.wait(timeout=60)
            return session.post(
                url,
                json=body,
                headers={"Authorization": f"Token {token}", "Connection": "close"},
                timeout=120,
            )

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        responses = list(pool.map(one, range(CLIENTS)))
    _wait_for_server_connections_to_close()
    return responses


@pytest.mark.services
def test_fifty_concurrent_conflicting_requests_accept_exactly_one(
    postgresql_db: None, live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    url = f"{live_server.url}/api/jobs/{lineage.job.name}/operations/"
    for round_ in range(2):
        responses = _storm(url, tokens["operator"], {"kind": "stop", "reason": f"r{round_}"})
        statuses = Counter(r.status_code for r in responses)
        assert statuses == {202: 1, 409: CLIENTS - 1}, statuses
        accepted = next(r for r in responses if r.status_code == 202).json()
        for response in responses:
            if response.status_code == 409:
                error = response.json()["error"]
                assert error["code"] == "operation_in_progress"
                assert error["detail"]["operation"] == accepted["id"]
        active = Operation.objects.filter(job=lineage.job, state__in=ACTIVE_STATES)
        assert [str(op.pk) for op in active] == [accepted["id"]]
        # End it so the next round races for the job again.
        cancel = requests.post(
            f"{accepted['url']}cancel/",
            headers={"Authorization": f"Token {tokens['operator']}", "Connection": "close"},
            timeout=60,
        )
        assert cancel.status_code == 200
        _wait_for_server_connections_to_close()
    assert Operation.objects.filter(job=lineage.job).count() == 2


@pytest.mark.services
def test_fifty_concurrent_replays_of_one_idempotency_key_share_one_operation(
    postgresql_db: None, live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    url = f"{live_server.url}/api/jobs/{lineage.job.name}/operations/"
    barrier = threading.Barrier(CLIENTS)

    def one(_: int) -> requests.Response:
        barrier.wait(timeout=60)
        return requests.post(
            url,
            json={"kind": "stop"},
            headers={
                "Authorization": f"Token {tokens['operator']}",
                "Idempotency-Key": "once",
                "Connection": "close",
            },
            timeout=120,
        )

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        responses = list(pool.map(one, range(CLIENTS)))
    _wait_for_server_connections_to_close()
    statuses = Counter(r.status_code for r in responses)
    assert statuses[202] == 1 and statuses[202] + statuses[200] == CLIENTS, statuses
    assert len({r.json()["id"] for r in responses}) == 1
    assert Operation.objects.filter(job=lineage.job).count() == 1
