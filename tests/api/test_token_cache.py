"""The token cache (controlplane/accounts/token_cache.py): a token seen recently is checked
with one plain statement instead of a lookup, and a revocation, a new expiry, a deactivated
user or a lost role committed anywhere is refused on the very next request — in this process
and in a separate web server process that had the token cached."""

from __future__ import annotations

import http.client
import secrets
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from bench.api import serve
from controlplane.accounts.models import ApiToken
from controlplane.accounts.roles import ADMIN, OPERATOR, VIEWER, assign_role
from controlplane.accounts.services import user_create
from controlplane.accounts.token_cache import TOKENS
from controlplane.accounts.tokens import token_create, token_revoke
from tests.api.conftest import current_database_url
from tests.security.servers import SERVER


@pytest.fixture
def server(postgresql_db: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The web server as deployed (2 workers, 2 pooled connections each) serving the test
    database: another process's cache."""
    monkeypatch.setenv("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    with serve(
        current_database_url(), server=SERVER, workers=2, threads=4, watch_slots=1, db_pool=2
    ) as (port, _):
        yield port


def _status(port: int, secret: str, path: str = "/api/jobs/") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Token {secret}"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _warm(port: int, secret: str) -> None:
    """Enough requests that both workers have served (and cached) the token."""
    assert [_status(port, secret) for _ in range(8)] == [200] * 8


@pytest.mark.django_db(transaction=True)
def test_another_process_refuses_a_revoked_token_on_the_next_request(server: int) -> None:
    user = user_create(username="watcher", role=VIEWER)
    issued = token_create(user=user, name="cli")
    _warm(server, issued.secret)
    token_revoke(token=issued.token)
    assert [_status(server, issued.secret) for _ in range(4)] == [401] * 4


@pytest.mark.django_db(transaction=True)
def test_another_process_refuses_an_expired_or_re_dated_token_at_once(server: int) -> None:
    user = user_create(username="dated", role=VIEWER)
    issued = token_create(user=user, expires_in_days=1)
    _warm(server, issued.secret)
    # re-dated into the past by a direct update (no service code): the trigger records it
    ApiToken.objects.filter(pk=issued.token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert [_status(server, issued.secret) for _ in range(4)] == [401] * 4


@pytest.mark.django_db(transaction=True)
def test_another_process_sees_a_deactivated_user_and_a_lost_role_at_once(server: int) -> None:
    user = user_create(username="mover", role=OPERATOR)
    issued = token_create(user=user)
    _warm(server, issued.secret)
    assert _status(server, issued.secret, "/api/users/") == 403  # admin only
    assign_role(user, ADMIN)
    assert [_status(server, issued.secret, "/api/users/") for _ in range(4)] == [200] * 4
    user.groups.clear()  # no role left: every read is 403
    assert [_status(server, issued.secret) for _ in range(4)] == [403] * 4
    assign_role(user, VIEWER)
    assert [_status(server, issued.secret) for _ in range(4)] == [200] * 4
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    assert [_status(server, issued.secret) for _ in range(4)] == [401] * 4


@pytest.mark.django_db(transaction=True)
def test_a_cached_token_costs_one_plain_statement_and_expires_by_the_clock() -> None:
    user = user_create(username="cached", role=VIEWER)
    issued = token_create(user=user)
    expires = timezone.now() + timedelta(seconds=5)
    ApiToken.objects.filter(pk=issued.token.pk).update(expires_at=expires)
    TOKENS.clear()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issued.secret}")
    with CaptureQueriesContext(connection) as first:
        assert client.get("/api/jobs/").status_code == 200
    with CaptureQueriesContext(connection) as second:
        assert client.get("/api/jobs/").status_code == 200
    lookups = [q["sql"] for q in first.captured_queries if "accounts_apitoken" in q["sql"]]
    assert len(lookups) == 2  # the miss: one lookup (token, user, role, revision), one use
    assert not any("accounts_apitoken" in q["sql"] for q in second.captured_queries)
    assert any("changes_change" in q["sql"] for q in second.captured_queries)
    assert len(second.captured_queries) == len(first.captured_queries) - 1

    # the expiry passes with no change recorded: the clock alone refuses the cached token
    time.sleep(max(0.0, (expires - timezone.now()).total_seconds()) + 0.1)
    response = client.get("/api/jobs/")
    assert response.status_code == 401 and "expired" in response.json()["error"]["message"]
