"""API tokens: stored hashed (a prefix identifies one, the secret is shown once), optional
expiry, last-used time, rotate and revoke over REST, the command line and the admin; every
change and every refusal of a known token audited. Through a live server."""

from __future__ import annotations

import importlib
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
import requests
from django.apps import apps as global_apps
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from controlplane.accounts.models import ApiToken, token_digest
from controlplane.accounts.services import user_create
from controlplane.audit.models import AuditEntry
from tests.api.conftest import Lineage

pytestmark = pytest.mark.django_db(transaction=True)


def call(base: str, secret: str, method: str, path: str, **body: Any) -> requests.Response:
    return requests.request(
        method,
        f"{base}{path}",
        json=body if method in ("POST", "PATCH") else None,
        headers={"Authorization": f"Token {secret}", "Connection": "close"},
        timeout=60,
    )


def test_a_token_is_stored_hashed_shown_once_and_records_its_last_use(
    live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    base = live_server.url
    issued = call(base, tokens["viewer"], "POST", "/api/tokens/", name="laptop")
    assert issued.status_code == 201, issued.text
    body = issued.json()
    secret = body["token"]
    assert secret.startswith("epo_") and secret.startswith(body["prefix"])
    stored = ApiToken.objects.get(pk=body["id"])
    assert stored.digest == token_digest(secret) and secret not in str(vars(stored))
    # Never shown again, and never in the audit log.
    listed = call(base, tokens["viewer"], "GET", "/api/tokens/").json()["results"]
    assert body["id"] in [t["id"] for t in listed] and "token" not in listed[0]
    assert not any(secret in str(e.detail) for e in AuditEntry.objects.all())
    assert AuditEntry.objects.filter(action="token.create", actor_name="viewer").exists()
    assert stored.last_used_at is None
    assert call(base, secret, "GET", "/api/jobs/").status_code == 200
    stored.refresh_from_db()
    assert stored.last_used_at is not None


def test_rotate_and_revoke_over_rest_end_the_old_secret_and_are_audited(
    live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    base = live_server.url
    first = call(base, tokens["operator"], "POST", "/api/tokens/", expires_in_days=30).json()
    rotated = call(base, tokens["operator"], "POST", f"/api/tokens/{first['id']}/rotate/")
    assert rotated.status_code == 201, rotated.text
    second = rotated.json()
    assert second["prefix"] != first["prefix"] and second["expires_at"] is not None
    old = call(base, first["token"], "GET", "/api/jobs/")
    assert old.status_code == 401 and "revoked" in old.json()["error"]["message"]
    assert call(base, second["token"], "GET", "/api/jobs/").status_code == 200
    revoked = call(base, second["token"], "DELETE", f"/api/tokens/{second['id']}/")
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    assert call(base, second["token"], "GET", "/api/jobs/").status_code == 401
    again = call(base, tokens["operator"], "DELETE", f"/api/tokens/{second['id']}/")
    assert again.status_code == 409
    actions = set(
        AuditEntry.objects.filter(detail__user="operator").values_list("action", flat=True)
    )
    assert {"token.create", "token.rotate", "token.revoke", "token.refused"} <= actions
    refused = AuditEntry.objects.get(action="token.refused", detail__token=first["prefix"])
    assert refused.status_code == 401 and refused.detail["why"] == "revoked"


def test_an_expired_token_is_refused_and_audited(
    live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    base = live_server.url
    issued = call(base, tokens["viewer"], "POST", "/api/tokens/", expires_in_days=1).json()
    assert call(base, issued["token"], "GET", "/api/jobs/").status_code == 200
    ApiToken.objects.filter(pk=issued["id"]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    refused = call(base, issued["token"], "GET", "/api/jobs/")
    assert refused.status_code == 401 and "expired" in refused.json()["error"]["message"]
    assert AuditEntry.objects.filter(action="token.refused", detail__why="expired").exists()
    too_long = call(base, tokens["viewer"], "POST", "/api/tokens/", expires_in_days=10**6)
    assert too_long.status_code == 400 and "expires_in_days" in too_long.json()["error"]["fields"]


def test_only_admins_manage_other_users_tokens(
    live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    base = live_server.url
    mine = call(base, tokens["viewer"], "POST", "/api/tokens/").json()
    theirs = call(base, tokens["operator"], "POST", "/api/tokens/", user="viewer")
    assert theirs.status_code == 403 and "user" in theirs.json()["error"]["fields"]
    peek = call(base, tokens["operator"], "DELETE", f"/api/tokens/{mine['id']}/")
    assert peek.status_code == 404
    by_admin = call(base, tokens["admin"], "DELETE", f"/api/tokens/{mine['id']}/")
    assert by_admin.status_code == 200
    entry = AuditEntry.objects.get(action="token.revoke", detail__token=mine["prefix"])
    assert entry.actor_name == "admin" and entry.detail["user"] == "viewer"


def test_the_command_line_issues_lists_rotates_and_revokes(
    live_server: Any, lineage: Lineage
) -> None:
    user_create(username="ana", role="viewer")
    out = StringIO()
    call_command("token", "ana", "--name", "ci", stdout=out, stderr=StringIO())
    secret = out.getvalue().strip()
    assert call(live_server.url, secret, "GET", "/api/jobs/").status_code == 200
    listing = StringIO()
    call_command("token", "ana", "--list", stdout=listing)
    token = ApiToken.objects.get(user__username="ana")
    assert token.prefix in listing.getvalue() and secret not in listing.getvalue()
    rotated = StringIO()
    call_command("token", "ana", "--rotate", token.prefix, stdout=rotated, stderr=StringIO())
    new_secret = rotated.getvalue().strip()
    assert call(live_server.url, secret, "GET", "/api/jobs/").status_code == 401
    assert call(live_server.url, new_secret, "GET", "/api/jobs/").status_code == 200
    call_command("token", "ana", "--revoke", new_secret[:12], stdout=StringIO())
    assert call(live_server.url, new_secret, "GET", "/api/jobs/").status_code == 401
    changes = AuditEntry.objects.filter(detail__user="ana").exclude(action="token.refused")
    assert sorted(changes.values_list("action", "source")) == [
        ("token.create", "cli"),
        ("token.revoke", "cli"),
        ("token.revoke", "cli"),
        ("token.rotate", "cli"),
    ]


def test_the_admin_issues_a_token_shown_once_and_revokes_it(
    live_server: Any, lineage: Lineage
) -> None:
    admin = user_create(username="root", role="admin", password="a long enough secret")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    browser = Client()
    browser.force_login(admin)
    viewer = ApiToken.objects.model.user.field.related_model.objects.get(username="viewer")
    page = browser.post(
        "/admin/accounts/apitoken/add/",
        {"user": viewer.pk, "name": "from admin", "expires_in_days": "7"},
        follow=True,
    )
    shown = [str(m) for m in page.context["messages"] if "epo_" in str(m)]
    assert len(shown) == 1
    secret = shown[0].split(": ", 1)[1].split(" ")[0]
    assert call(live_server.url, secret, "GET", "/api/jobs/").status_code == 200
    token = ApiToken.objects.get(name="from admin")
    assert token.expires_at is not None
    browser.post(
        "/admin/accounts/apitoken/",
        {"action": "revoke", "_selected_action": [token.pk]},
        follow=True,
    )
    assert call(live_server.url, secret, "GET", "/api/jobs/").status_code == 401
    entry = AuditEntry.objects.get(action="token.revoke", detail__token=token.prefix)
    assert entry.source == "admin" and entry.actor_name == "root"


def test_plain_tokens_of_before_are_hashed_by_the_migration(lineage: Lineage) -> None:
    """DRF's plain authtoken rows become hashed tokens with the same secret; the plain copies
    are gone."""
    migration = importlib.import_module("controlplane.accounts.migrations.0003_hash_plain_tokens")
    plain = "0123456789abcdef0123456789abcdef01234567"
    viewer = ApiToken.objects.model.user.field.related_model.objects.get(username="viewer")
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, user_id integer, "
            "created timestamp with time zone)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token VALUES (%s, %s, %s)", [plain, viewer.pk, timezone.now()]
        )
    try:
        with connection.schema_editor() as editor:
            migration.hash_plain_tokens(global_apps, editor)
        token = ApiToken.objects.get(digest=token_digest(plain))
        assert token.user == viewer and token.prefix == plain[:8]
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM authtoken_token")
            assert cursor.fetchone() == (0,)
        from controlplane.accounts.tokens import token_authenticate

        assert token_authenticate(plain)[0] == viewer
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE authtoken_token")
