"""PostgreSQL away (its connections cut or reset by a TCP proxy between the control plane and
the real server) while jobs commit and the API serves: requests answer 503 with Retry-After, not
500; liveness stays up while readiness says the database is away; a client retrying an
operation request with its Idempotency-Key gets exactly one operation; commits made to the store
meanwhile (the store is the engine's truth: it needs no database) are in the lineage index after
the reconciler's next pass."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from controlplane.accounts.services import user_create, user_token
from controlplane.lineage.models import Snapshot
from controlplane.operations.models import Operation
from controlplane.operations.reconciler import reindex_all
from tests.api.conftest import build_lineage, commit
from tests.faults.report import injections, record
from tests.faults.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def database_proxy() -> Iterator[TcpProxy]:
    """This process's database connection goes through a proxy the test controls."""
    settings = connection.settings_dict
    upstream = (settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    original = settings["PORT"]
    with TcpProxy(upstream) as proxy:
        connection.close()
        settings["PORT"] = str(proxy.port)
        try:
            yield proxy
        finally:
            proxy.passthrough()
            connection.close()
            settings["PORT"] = original
    _end_other_sessions()


def _end_other_sessions() -> None:
    """End the sessions this test left on its database (``pg_terminate_backend``): one a
    request opened through the proxy outlives the test otherwise, and the test database is
    dropped at the end of the run, which no open session allows."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    connection.close()


@pytest.fixture
def operator(settings: Any, tmp_path: Path) -> APIClient:
    settings.EPOCHAL_STORE_URL = f"file://{tmp_path / 'store'}"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    client = APIClient(raise_request_exception=False)  # as over HTTP: the server's answer
    client.default_format = "json"
    token = user_token(user=user_create(username="operator", role="operator"))
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _until_ready(client: APIClient, limit_s: float = 30) -> float:
    began = time.monotonic()
    while client.get("/healthz/ready").status_code != 200:
        assert time.monotonic() - began < limit_s, "the database did not come back"
        time.sleep(0.05)
    return time.monotonic() - began


def test_api_answers_503_with_retry_after_while_the_database_is_away_then_catches_up(
    database_proxy: TcpProxy, operator: APIClient
) -> None:
    lineage = build_lineage()
    job_ops = f"/api/jobs/{lineage.job.name}/operations/"
    snapshots = f"/api/applications/{lineage.application.name}/snapshots/"
    assert operator.get(snapshots).status_code == 200
    head = lineage.main[-1]
    committed_during_outages: list[str] = []
    recover_s: list[float] = []
    accepted: set[str] = set()
    wanted = injections()
    for n in range(wanted):
        (database_proxy.cut if n % 2 == 0 else database_proxy.reset)()
        # the engine keeps committing: the store needs no database
        head = commit(lineage.repo, "main", head, 5 + n)
        committed_during_outages.append(head)
        for response in (
            operator.get(snapshots),
            operator.post(job_ops, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY=f"stop-{n}"),
            operator.get("/healthz/ready"),
            operator.get("/healthz"),
            operator.get("/metrics"),
        ):
            assert response.status_code == 503, (response.status_code, response.content[:300])
            assert response["Retry-After"] == "5"
            assert response.json()["error"]["code"] == "database_unavailable"
        assert operator.get("/healthz/live").status_code == 200  # alive: do not restart it
        database_proxy.passthrough()
        recover_s.append(_until_ready(operator))
        # the client retries its request with the same key: one operation, not two
        first = operator.post(job_ops, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY=f"stop-{n}")
        again = operator.post(job_ops, {"kind": "stop"}, HTTP_IDEMPOTENCY_KEY=f"stop-{n}")
        assert first.status_code in (202, 409), first.content
        if first.status_code == 202:
            assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
            accepted.add(first.json()["id"])
            operator.post(f"{first.json()['url']}cancel/")
    assert database_proxy.connections > 0  # the requests did go through the proxy
    # the lineage index catches up from the store: nothing committed meanwhile is lost
    reindex_all()
    indexed = set(Snapshot.objects.values_list("snapshot_id", flat=True))
    lost = [s for s in committed_during_outages if s not in indexed]
    assert not lost
    stops = Operation.objects.filter(kind="stop").count()
    duplicated = stops - len(accepted)
    assert stops == len(accepted) >= 1  # none refused with 503 was created; none twice
    response = operator.get(snapshots)
    assert response.status_code == 200
    record("database", injected=wanted, survived=wanted - len(lost), lost=len(lost),
           duplicated=duplicated, recover_s=recover_s)  # fmt: skip
